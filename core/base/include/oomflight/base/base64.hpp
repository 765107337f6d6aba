// Base64 (RFC 4648 section 4: the standard alphabet, '=' padding, no line breaks): how binary values (a pickled
// snapshot field) travel through the archive's string table, which holds UTF-8 text only.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "oomflight/api.h"

namespace oomflight {

/// Encodes `bytes`: 4 characters per 3 bytes, the last group padded with '='. Pure; thread-safe.
OOMFLIGHT_API std::string base64_encode(std::string_view bytes);

/// Decodes text that base64_encode wrote (padding required, no whitespace). Returns nothing for any other text: a
/// character outside the alphabet, a length not a multiple of 4, padding anywhere but at the end, or non-zero bits
/// after the last byte (so that one text has one decoding). Pure; thread-safe.
OOMFLIGHT_API std::optional<std::string> base64_decode(std::string_view text);

}  // namespace oomflight
