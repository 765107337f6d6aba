// The redaction rule for everything oomflight copies from a rank's environment or a job's metadata into an
// archive: a value whose name looks like a secret's is replaced by "<redacted>" before it is stored anywhere.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "oomflight/api.h"

namespace oomflight {

/// What a redacted value reads as.
inline constexpr std::string_view kRedacted = "<redacted>";

/// Whether `name` (an environment variable, a metadata key, a command-line option such as "--api-key") looks like
/// it names a secret: it contains, case-insensitively, KEY, TOKEN, SECRET, PASSWORD, PASSWD, PASSPHRASE,
/// CREDENTIAL, AUTH, COOKIE, SESSION, SIGNATURE or PRIVATE (so WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY,
/// DB_PASSWORD, GOOGLE_APPLICATION_CREDENTIALS, --auth-header). Errs towards redacting (MONKEY_COUNT is
/// redacted too): a lost harmless value costs less than a leaked key. Pure; thread-safe.
OOMFLIGHT_API bool looks_secret(std::string_view name);

/// `value`, or "<redacted>" when looks_secret(name); otherwise with the userinfo of every URL in it redacted
/// (redacted_urls).
OOMFLIGHT_API std::string redacted(std::string_view name, std::string_view value);

/// `text` with the userinfo of every URL replaced ("postgres://user:password@host/db" ->
/// "postgres://<redacted>@host/db", "https://token@github.com/x" -> "https://<redacted>@github.com/x"; RFC 3986
/// section 3.2.1: the userinfo is what precedes the last '@' of the authority, which runs from "://" to the next
/// '/', '?', '#', whitespace or quote). Text without "://" comes back as it is. Pure; thread-safe.
OOMFLIGHT_API std::string redacted_urls(std::string_view text);

/// A command line with secret values redacted, arguments joined by spaces: the value after a secret-looking option
/// ("--api-key X" -> "--api-key <redacted>"), and every NAME=VALUE inside any argument whose NAME looks secret
/// ("--api-key=X", "HF_TOKEN=X", and `key="X"` inside a `python -c` script; a quoted value keeps its quotes), and
/// the userinfo of URLs in any argument (redacted_urls).
OOMFLIGHT_API std::string redacted_command_line(const std::vector<std::string>& arguments);

}  // namespace oomflight
