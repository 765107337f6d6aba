// The HTML report: the post-mortem of an archive as one self-contained page (`oomflight report --html`).
#pragma once

#include <cstddef>
#include <string>

#include "oomflight/analysis/post_mortem.hpp"
#include "oomflight/api.h"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight {

/// Renders the post-mortem as one HTML5 page that needs nothing else: its styles, its script and its charts
/// (SVG) are inline, it names no URL, and its Content-Security-Policy forbids loading anything, so it opens
/// offline, from a mail attachment or a ticket. It shows the header (run, kind, time, reason, origins, world),
/// each rank's allocated and reserved bytes over time on one time axis shared by all ranks (replayed from the
/// events, at most 2,000 points per rank, each the peak of its interval; the origins drawn in red, their
/// out-of-memory events marked), a per-rank table at the trigger, each rank's per-batch peaks (the last 12
/// batches), each origin's live memory by call site with its top `frames` frames (docs/html-report.md), the
/// origin against its peers, and every rank's headroom against its capacity. The chart data is also embedded as
/// JSON (`<script id="oomflight-data" type="application/json">`).
///
/// Sizes are printed as format_bytes() prints them (binary units), times in seconds since the earliest recorded
/// event of any rank. Every string taken from the archive is HTML-escaped in markup and JSON-escaped (with `<`, `>`
/// and `&` as \u escapes) in the script, so an archive cannot inject markup or script into the page.
///
/// Pure: reads `archive` and `pm` (from analyze(archive, ...)) and allocates the result; thread-safe. Throws
/// only std::bad_alloc. A damaged archive (anchors or sizes out of any sensible range) gives a page of nonsense
/// figures, never undefined behaviour.
OOMFLIGHT_API std::string render_html_report(const Archive& archive, const PostMortem& pm, std::size_t frames = 6);

}  // namespace oomflight
