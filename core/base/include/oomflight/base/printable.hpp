// Text from a job or a file, made safe to show. A communicator name, a reason, a host, a path, a command line or a
// context value is set by the job (or read from a file anyone could have written), and a terminal acts on what it
// is sent: "\x1b]0;...\x07" retitles the window, "\x1b[2J" clears the screen, "\r" or "\n" forges a line of the
// report or of the log (issue 30). Every such string goes through printable() before it reaches a terminal or a
// log line; HTML and JSON outputs escape for their own medium (html_report.cpp, perfetto.cpp).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "oomflight/api.h"

namespace oomflight {

/// The length in bytes (1 to 4) of the well-formed UTF-8 sequence that starts at `text[i]`, or 0 when none does
/// there (a stray continuation byte, an overlong form, a surrogate, a code point above U+10FFFF, a sequence cut
/// short by the end of `text`: RFC 3629, section 4). `i` must be below text.size(). Pure; thread-safe.
OOMFLIGHT_API std::size_t utf8_sequence_length(std::string_view text, std::size_t i);

/// Whether printable() keeps line feeds ('\n') of `text` as they are (for text made of lines, such as a whole
/// report whose fields were made printable already) or shows them as "\n" (for one field, one log line).
enum class LineFeeds { escape, keep };

/// `text` with everything a terminal would act on, or that would forge a line, shown as a visible escape, and
/// everything else unchanged (UTF-8 text in any script stays readable):
///   - the C0 controls and DEL: "\n", "\r", "\t" as those two characters, the others as "\xNN" ("\x1b" for ESC);
///     '\n' stays when `line_feeds` is keep;
///   - the C1 controls U+0080 to U+009F (8-bit CSI is U+009B) as "\u0080" to "\u009f";
///   - the bidirectional embeddings, overrides and isolates U+202A to U+202E and U+2066 to U+2069, which reorder
///     how the text after them is displayed (CVE-2021-42574, "Trojan Source"), as "\u202e" and so on;
///   - every byte that is not part of well-formed UTF-8 as "\xNN".
/// A backslash stays a backslash: this is for display, not a reversible encoding. Linear in text.size(); the
/// result is at most 6 times as long. Pure; thread-safe.
OOMFLIGHT_API std::string printable(std::string_view text, LineFeeds line_feeds = LineFeeds::escape);

}  // namespace oomflight
