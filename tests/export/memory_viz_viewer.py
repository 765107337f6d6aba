#!/usr/bin/python3
"""PyTorch memory-snapshot pickles in PyTorch's own viewer: MemoryViz.js (the page behind pytorch.org/memory_viz),
run offline in Debian's headless Chromium from a file:// page, with the local d3 copies of the viewer folder.

Why: `oomflight export --format memory_viz` writes pickles for that viewer. Python's pickle loading them proves
little: MemoryViz.js has its own unpickler (protocols 2-4, a fixed set of opcodes) and it replays the trace
backwards from the end state when an entry of Allocator State History is selected, which throws on an inconsistent
trace (a block put back outside every segment, a free_requested with no block). This test shows each pickle to the
real viewer and fails on what a person would see as a broken or empty page.

For each pickle, one Chromium run loads it with `add_local_files([{name, base64}], view)` and, through the viewer's
own view selector (and device selector, for every device it lists), shows each of its three views:

- Active Memory Timeline and Active Cached Segment Timeline: the plot's polygons (one per allocation, or per
  segment, plus the "summarized" one). Checked: no point is NaN/Infinity, at least one polygon has an area, and
  the number of polygons and the Detail slider's maximum (the viewer's element count) equal what the pickle holds,
  counted in Python the way MemoryViz.js's process_alloc_data counts (allocs, frees with no alloc before them,
  blocks or segments live at the end and never allocated in the trace; at most 15000 drawn).
- Allocator State History: the list of trace entries on the left (one <pre> each; free_requested + free_completed
  of one block shown as one `free` entry) and the segments and blocks as rects on the right. The viewer selects the
  last entry by itself: the entry count and the segments, blocks and reserved bytes drawn there must equal the
  pickle's. Then the first, a middle and the last entry are selected the way a click does (a mousedown on the
  entry, the handler the viewer attaches): each time the entry must be the one highlighted, the stack pane must
  show its "(X allocated / Y reserved)" header, the drawing must hold rects (a segment at least) with finite
  coordinates, and nothing may have thrown.
- Everywhere: no page error. A script injected before the viewer collects window error events (uncaught errors,
  module scripts' included, and scripts that fail to load), unhandled promise rejections and console.error calls,
  each stamped with the view and step it happened in; Chromium's own log (stderr) must have no "Uncaught" line.

The whole run happens in the page's own scripts, before its load event: the viewer works synchronously except for
one requestAnimationFrame (Allocator State History selects its last entry in it), and the injected script queues
animation frames for the driver to run at each step. (Waiting for real frames does not work with --dump-dom: with
--virtual-time-budget, virtual time ran out before the frames came, and the DOM was dumped half-way.) The page
writes its findings as JSON into <pre id="mv-result"> (after removing the viewer's DOM, so that --dump-dom stays
small); a page that never writes it (a hang, a script that did not load) fails, and so does a Chromium run past
its time limit.

Usage: memory_viz_viewer.py VIEWER_DIR PICKLE_OR_DIR [PICKLE_OR_DIR ...]   (a directory: every *.pickle in it)
Prints one line per pickle and view with the counts; on failure one
`memory_viz_viewer: FAILED: <pickle>: <view>: <what>` line per failure (all pickles are checked) and exit 1.
"""
import base64
import glob
import html
import json
import os
import pickle
import re
import shutil
import sys
import tempfile
import time

import headless_chromium
from headless_chromium import CHROMIUM

VIEWS = ["Active Memory Timeline", "Active Cached Segment Timeline", "Allocator State History"]
MAX_ENTRIES = 15000  # create_trace_view's default max_entries: the largest 15000 elements get a polygon each

# Collects every page error before anything else runs. `capture: true` also sees <script src> that fail to load.
ERROR_HOOK = r"""
window.__mv = {view: 'page', step: 'load', errors: []};
window.__mvRecord = (what) => window.__mv.errors.push({view: window.__mv.view, step: window.__mv.step, what});
window.__mvDescribe = e => (e && e.stack ? e.stack.split('\n').slice(0, 2).join(' ').replace(/file:\/\/\S*\//g, '')
                                         : String(e));
window.addEventListener('error', e => {
  const t = e.target;
  if (t && t !== window && (t.src || t.href)) {
    window.__mvRecord(`could not load ${t.src || t.href}`);
    return;
  }
  const where = e.filename ? ` (${e.filename.split('/').pop()}:${e.lineno})` : '';
  const message = String(e.message).startsWith('Uncaught') ? e.message : `Uncaught ${e.message}`;
  window.__mvRecord(`${message}${where}`);
}, true);
window.addEventListener('unhandledrejection', e => {
  window.__mvRecord(`unhandled rejection: ${e.reason && e.reason.stack ? e.reason.stack : e.reason}`);
});
// Animation frames run when the driver says so (settle()): everything then happens in the page's scripts, before
// its load event, which is when --dump-dom dumps. (With --virtual-time-budget instead, virtual time ran out before
// the real frames came.) MemoryViz.js asks for one frame: create_segment_view selects its last entry in it.
window.__mvFrames = [];
window.requestAnimationFrame = callback => window.__mvFrames.push(callback);
const __mvConsoleError = console.error;
console.error = (...args) => {
  window.__mvRecord(`console.error: ${args.map(String).join(' ')}`);
  __mvConsoleError.apply(console, args);
};
"""

# The script order of the viewer folder's example.html: d3 v5, then the four v1 modules sharing its d3-selection.
D3_SETUP = """
<script src="viewer/lib/d3@5.16.0.js"></script>
<script>window.__d3v5 = window.d3; window.d3 = Object.create(window.__d3v5);</script>
<script src="viewer/lib/d3-axis@1.0.12.js"></script>
<script src="viewer/lib/d3-scale@1.0.7.js"></script>
<script src="viewer/lib/d3-zoom@1.8.3.js"></script>
<script src="viewer/lib/d3-brush@1.1.6.js"></script>
<script>window.__d3v1mods = window.d3; window.d3 = window.__d3v5;</script>
"""

# Drives the viewer like a person would, measures what it drew, writes the JSON result. Runs after snapshot.js
# (a classic script, so it has set window.__mvSnapshot before this deferred module runs).
DRIVER = r"""
import {add_local_files} from './viewer/MemoryViz.js';

const VIEWS = __VIEWS__;
const mv = window.__mv;
const result = {devices: [], shown: [], done: false};
// An animation frame, run here: create_segment_view selects its last entry in one (see ERROR_HOOK).
function settle() {
  for (const callback of window.__mvFrames.splice(0)) {
    try {
      callback(performance.now());
    } catch (e) {
      window.__mvRecord(`Uncaught ${window.__mvDescribe(e)} (in an animation frame)`);
    }
  }
}

function choose(select, value) {
  select.value = value;
  if (select.value !== String(value)) {
    window.__mvRecord(`the viewer's selector has no option ${value}`);
    return false;
  }
  select.dispatchEvent(new Event('change'));
  return true;
}

// The div of the view being shown: snapshot_change shows one div per (file, view, device) and hides the others.
function shownDiv(r) {
  const divs = [...document.querySelectorAll('body > div')].filter(d => d.style.display !== 'none');
  if (divs.length !== 1) {
    r.problem = `${divs.length} view divs shown, expected 1`;
    return null;
  }
  return divs[0];
}

function finite(el, attrs) {
  return attrs.every(a => el.getAttribute(a) === null || Number.isFinite(Number(el.getAttribute(a))));
}

function measureTimeline(div, r) {
  const svgs = div.querySelectorAll('svg');  // the plot, then the minimap
  if (svgs.length < 2) {
    r.problem = `${svgs.length} svg elements, expected the plot and the minimap`;
    return;
  }
  Object.assign(r, {polygons: 0, summarized: 0, with_area: 0, bad_points: 0});
  for (const p of svgs[0].querySelectorAll('polygon')) {
    if (p.__data__ && p.__data__.elem === 'summarized') r.summarized++; else r.polygons++;
    const nums = (p.getAttribute('points') || '').split(/[\s,]+/).filter(s => s !== '').map(Number);
    if (nums.some(n => !Number.isFinite(n))) {
      r.bad_points++;
      continue;
    }
    let twice_area = 0;  // the shoelace formula: a band of zero height (a size of 0) has none
    for (let i = 0; i + 1 < nums.length; i += 2) {
      const j = (i + 2) % nums.length;
      twice_area += nums[i] * nums[j + 1] - nums[j] * nums[i + 1];
    }
    if (Math.abs(twice_area) > 1e-6) r.with_area++;
  }
  const slider = div.querySelector('input[type=range]');
  r.elements = slider ? Number(slider.getAttribute('max')) : null;
  r.minimap_polygons = svgs[1].querySelectorAll('polygon').length;
}

function measureState(div, r) {
  const grid = div.firstElementChild;  // stack pane <pre>, the memory <svg>, the entry list <div>
  const entries = grid ? grid.querySelectorAll(':scope > div > pre') : [];
  const svg = grid && grid.querySelector(':scope > svg');
  const info = grid && grid.querySelector(':scope > pre');
  if (!svg || !info) {
    r.problem = 'no memory drawing (svg) or stack pane (pre) in the view';
    return entries;
  }
  const groups = svg.querySelectorAll(':scope > g > g');  // MemoryView.draw: segments, blocks, rounding waste
  const rects = [...svg.querySelectorAll('rect')];
  r.entries = entries.length;
  r.segments = groups.length > 0 ? groups[0].querySelectorAll('rect').length : 0;
  r.blocks = groups.length > 1 ? groups[1].querySelectorAll('rect').length : 0;
  r.rects = rects.length;
  r.bad_rects = rects.filter(x => !finite(x, ['x', 'y', 'width', 'height'])).length;
  const lit = e => (e.getAttribute('style') || '').includes('background-color');  // es.select's highlight
  r.highlighted = [...entries].flatMap((e, i) => (lit(e) ? [i] : []));
  const header = info.textContent.match(/^\(.*?\((-?\d+) bytes\) allocated \/ .*?\((-?\d+) bytes\) reserved\)/);
  r.reserved = header ? Number(header[2]) : null;  // null: no header
  return entries;
}

// Shows `view` (of `device`, when the viewer lists several) through the viewer's own selectors, and measures it.
function showView(view, device, switchDevice) {
  mv.view = switchDevice ? `device ${device}: ${view}` : view;
  mv.step = 'show';
  const r = {view, device};
  result.shown.push(r);
  const selects = document.querySelectorAll('body > select');  // the viewer's: file, view, device
  if (selects.length !== 3) {
    r.problem = `${selects.length} <select> elements, expected the viewer's file, view and device selectors`;
    return;
  }
  if (!choose(selects[1], view)) return;
  if (switchDevice && !choose(selects[2], device)) return;
  settle();
  const div = shownDiv(r);
  if (div === null) return;
  if (view !== 'Allocator State History') {
    measureTimeline(div, r);
    return;
  }
  let entries = measureState(div, r);
  r.selections = [];
  const n = entries.length;
  for (const idx of n > 0 ? [0, Math.floor((n - 1) / 2), n - 1] : []) {
    mv.step = `select entry ${idx}`;
    const s = {idx};
    r.selections.push(s);
    entries[idx].dispatchEvent(new MouseEvent('mousedown', {bubbles: true, cancelable: true, view: window}));
    settle();
    entries = measureState(div, s);
  }
}

function main() {
  const snap = window.__mvSnapshot;
  mv.view = VIEWS[0]; mv.step = 'load';
  try {
    add_local_files([{name: snap.name, base64: snap.base64}], VIEWS[0]);
  } catch (e) {
    window.__mvRecord(`add_local_files threw ${window.__mvDescribe(e)}`);
  }
  settle();
  const selects = document.querySelectorAll('body > select');
  result.devices = selects.length === 3 ? [...selects[2].options].map(o => o.value) : [];
  // Every device the viewer lists (or, if it lists none, whatever it shows).
  for (const device of result.devices.length > 0 ? result.devices : [null]) {
    for (const view of VIEWS) {
      try {
        showView(view, device, result.devices.length > 1);
      } catch (e) {
        window.__mvRecord(`the test's driver threw ${e && e.stack ? e.stack : e}`);
      }
    }
  }
}

try {
  main();
  result.done = true;
} catch (e) {
  window.__mvRecord(`the test's driver threw ${e && e.stack ? e.stack : e}`);
} finally {
  result.errors = mv.errors;
  const pre = document.createElement('pre');
  pre.id = 'mv-result';
  pre.textContent = JSON.stringify(result);
  document.body.replaceChildren(pre);  // the viewer's DOM is megabytes of polygon points: keep the dump small
}
"""


def chromium_page(work, page, timeout):
    """Runs headless Chromium (headless_chromium.py) on `page`, its DOM dumped; returns (DOM, log, failure or None)."""
    out, err, failure = headless_chromium.run(work, ["--allow-file-access-from-files", "--dump-dom", "file://" + page],
                                              timeout)
    if failure and "ran past" in failure:
        failure += " (the page hung or the viewer is too slow)"
    return out, err, failure


def block_addrs(seg):
    """annotate_snapshot gives each block the address of its place in the segment: the segment's plus the sizes of
    the blocks before it (it does not read the block's own 'address')."""
    addr = seg["address"]
    for b in seg["blocks"]:
        yield addr, b
        addr += b["size"]


def expected_counts(snap):
    """What MemoryViz.js should show for each device of `snap`, counted the way it reads a snapshot: {device:
    {entries, state_segments, state_blocks, reserved, elements: {view: n}}}."""
    traces = snap["device_traces"]
    with_segments = {s["device"] for s in snap["segments"]}
    out = {}
    for device, trace in enumerate(traces):
        if not trace and device not in with_segments:
            continue  # snapshot_change lists a device only if it has trace entries or segments
        segments = [s for s in snap["segments"] if s["device"] == device]
        # annotate_snapshot: a free_completed right after the free_requested of the same address becomes one `free`.
        entries = []
        for e in trace:
            if (e["action"] == "free_completed" and entries and entries[-1][0] == "free_requested"
                    and entries[-1][1] == e["addr"]):
                entries[-1][0] = "free"
                continue
            entries.append([e["action"], e.get("addr")])
        active = {addr: b for seg in segments for addr, b in block_addrs(seg)
                  if b["state"] in ("active_allocated", "active_pending_free")}
        elements = {}
        for view, alloc, frees in (("Active Memory Timeline", "alloc", ("free", "free_completed")),
                                   ("Active Cached Segment Timeline", "segment_alloc", ("segment_free",))):
            # process_alloc_data: one element per alloc, per free with no alloc before it, and per block (segment)
            # live at the end whose alloc is not in the trace.
            live, n = set(), 0
            for action, addr in entries:
                if action == alloc:
                    n += 1
                    live.add(addr)
                elif action in frees:
                    if addr in live:
                        live.discard(addr)
                    else:
                        n += 1
            if alloc == "alloc":
                n += sum(1 for seg in segments for addr, b in block_addrs(seg)
                         if b["state"] == "active_allocated" and addr not in live)
            else:
                n += sum(1 for seg in segments if seg["address"] not in live)
            elements[view] = n
        out[str(device)] = {"entries": len(entries), "state_segments": len(segments), "state_blocks": len(active),
                            "reserved": sum(s["total_size"] for s in segments), "elements": elements}
    return out


def check_timeline(r, exp, fail):
    """Checks one timeline view's measures (and, when Python could read the pickle, its counts); returns the
    summary line's text."""
    if r["polygons"] == 0:
        fail("draws no allocation polygon")
    if r["with_area"] == 0:
        fail(f"none of its {r['polygons'] + r['summarized']} polygons has an area: it draws nothing")
    if r["bad_points"]:
        fail(f"{r['bad_points']} polygons have NaN or infinite points")
    if r["minimap_polygons"] == 0:
        fail("the minimap draws nothing")
    if exp is not None:
        n = exp["elements"][r["view"]]
        if r["elements"] != n:
            fail(f"the viewer counts {r['elements']} elements (Detail slider), the pickle holds {n}")
        if r["polygons"] != min(n, MAX_ENTRIES):
            fail(f"{r['polygons']} polygons drawn, expected {min(n, MAX_ENTRIES)} (one per element)")
    return (f"{r['polygons']} polygons (+{r['summarized']} summarized), {r['with_area']} of them with a visible "
            f"area, {r['elements']} elements")


def check_state(r, exp, fail):
    """Checks Allocator State History: the viewer's own pick (the last entry), its counts against the pickle's, and
    the three selections; returns the summary line's text.

    A pickle with segments but no trace entry is a true history: a rank frozen before its first traced event (the
    replay's rank still at batch -1, holding only the state that predates its trace; seen in CI, 1 run in several).
    The viewer then lists nothing to select and draws the end state with no "(X allocated / Y reserved)" header:
    that is checked instead of the entries, and it is said on the summary line."""
    no_trace = exp is not None and exp["entries"] == 0 and exp["state_segments"] > 0
    if no_trace:
        if r["entries"] != 0:
            fail(f"lists {r['entries']} trace entries, the pickle holds none")
        if r["rects"] == 0 or r["segments"] != exp["state_segments"] or r["blocks"] != exp["state_blocks"]:
            fail(f"draws {r['segments']} segments + {r['blocks']} blocks ({r['rects']} rects) of a trace-less "
                 f"pickle, which holds {exp['state_segments']} + {exp['state_blocks']}")
        return (f"0 entries (the pickle holds no trace entry); its state drawn: {r['segments']} segments + "
                f"{r['blocks']} blocks")
    if r["entries"] == 0:
        fail("lists no trace entry")
    if r["rects"] == 0:
        fail("draws no rect at the last entry")
    if r["bad_rects"]:
        fail(f"{r['bad_rects']} rects with NaN or infinite coordinates at the last entry")
    if r["entries"] and r["highlighted"] != [r["entries"] - 1]:
        fail(f"the viewer highlights entries {r['highlighted'][:5]} at start, expected its last one")
    if exp is not None:
        for measured, wanted, what in (("entries", "entries", "entries listed"),
                                       ("segments", "state_segments", "segments drawn at the last entry"),
                                       ("blocks", "state_blocks", "active blocks drawn at the last entry"),
                                       ("reserved", "reserved", "bytes reserved at the last entry")):
            if r[measured] != exp[wanted]:
                fail(f"{r[measured]} {what}, the pickle holds {exp[wanted]}")
    picks = []
    for s in r["selections"]:
        label = f"selecting entry {s['idx']}"
        if s.get("problem"):
            fail(f"{label}: {s['problem']}")
            continue
        if s["highlighted"] != [s["idx"]]:
            fail(f"{label}: highlighted entries are {s['highlighted'][:5]}, not just the selected one")
        if s["reserved"] is None:
            fail(f"{label}: the stack pane does not show the entry's '(X allocated / Y reserved)' header")
        if s["segments"] == 0 or s["rects"] == 0:
            fail(f"{label}: the drawing holds {s['rects']} rects ({s['segments']} segments): it draws nothing")
        if s["bad_rects"]:
            fail(f"{label}: {s['bad_rects']} rects with NaN or infinite coordinates")
        picks.append(f"{s['idx']}: {s['segments']} segments + {s['blocks']} blocks")
    return (f"{r['entries']} entries; at the last (the viewer's pick) {r['segments']} segments + {r['blocks']} "
            f"blocks, {r['reserved']} bytes reserved; selected " + ("; ".join(picks) or "nothing"))


def write_page(page_dir, viewer, name, data):
    """The page, the snapshot as a script setting a global (a 10 MB pickle inline would also come back in the
    dumped DOM), and a link to the viewer folder (MemoryViz.js is imported as a module, relative to the page)."""
    os.symlink(viewer, os.path.join(page_dir, "viewer"))
    padded = data + b"\0" * (-len(data) % 3)  # what torch.cuda._memory_viz does before base64
    with open(os.path.join(page_dir, "snapshot.js"), "w") as f:
        snapshot = {"name": name, "base64": base64.b64encode(padded).decode()}
        f.write(f"window.__mvSnapshot = {json.dumps(snapshot)};\n")
    page = os.path.join(page_dir, "page.html")
    with open(page, "w") as f:
        f.write(f"""<!DOCTYPE html>
<html><head><meta charset="utf-8">
<script>{ERROR_HOOK}</script>
{D3_SETUP}
</head><body>
<script src="snapshot.js"></script>
<script type="module">{DRIVER.replace("__VIEWS__", json.dumps(VIEWS))}</script>
</body></html>
""")
    return page


def check_pickle(path, work, viewer):
    """Renders one pickle in every view; returns (summary lines, failures as (view, what), seconds in Chromium)."""
    name = os.path.basename(path)
    failures, lines = [], []
    with open(path, "rb") as f:
        data = f.read()
    try:
        expected = expected_counts(pickle.loads(data))
    except Exception as e:  # noqa: BLE001 - any reason Python cannot read it is a finding; the viewer still runs
        expected = None
        failures.append(("pickle", f"Python's pickle cannot read it ({type(e).__name__}: {e}); no expected counts"))

    page_dir = tempfile.mkdtemp(prefix="page-", dir=work)
    page = write_page(page_dir, viewer, name, data)
    timeout = 60 + 10 * len(data) // 1_000_000
    started = time.monotonic()
    dom, log, problem = chromium_page(work, page, timeout)
    seconds = time.monotonic() - started
    shutil.rmtree(page_dir, ignore_errors=True)
    if problem:
        return lines, failures + [("page", problem)], seconds

    found = re.search(r'<pre id="mv-result">(.*?)</pre>', dom, re.S)
    if found is None:
        console = [line for line in log.splitlines() if "Uncaught" in line or ":CONSOLE" in line][-5:]
        return lines, failures + [("page", "the page's script did not finish: no result in the DOM; chromium's "
                                   "log ends with: " + " | ".join(console))], seconds
    result = json.loads(html.unescape(found.group(1)))
    if not result["done"]:
        failures.append(("page", "the page's script did not finish"))
    for e in result["errors"]:
        failures.append((e["view"], f"{e['step']}: {e['what']}"))
    # Chromium logs every uncaught error as a console line; report those the page's hook did not see.
    for line in log.splitlines():
        logged = re.search(r'"(Uncaught [^"]*)"', line) or re.search(r"(Uncaught.*)", line)
        if logged and not any(logged.group(1) in e["what"] for e in result["errors"]):
            failures.append(("page", f"chromium's log: {line.strip()[-300:]}"))

    if expected is not None and sorted(expected) != sorted(result["devices"]):
        failures.append(("page", f"the viewer lists devices {result['devices']}, the pickle holds {sorted(expected)}"))
    for r in result["shown"]:
        label = r["view"] if len(result["devices"]) <= 1 else f"device {r['device']}: {r['view']}"
        exp = expected.get(r["device"]) if expected is not None and r["device"] is not None else None

        def fail(what, label=label):
            failures.append((label, what))

        if r.get("problem"):
            fail(r["problem"])
        elif r["view"] == "Allocator State History":
            lines.append(f"{name}: {label}: {check_state(r, exp, fail)}")
        else:
            lines.append(f"{name}: {label}: {check_timeline(r, exp, fail)}")
    return lines, failures, seconds


def pickles_of(args):
    paths = []
    for arg in args:
        if os.path.isdir(arg):
            found = sorted(glob.glob(os.path.join(arg, "*.pickle")))
            if not found:
                print(f"memory_viz_viewer: FAILED: {arg}: no *.pickle in this directory")
                sys.exit(1)
            paths += found
        else:
            paths.append(arg)
    return paths


def main():
    if len(sys.argv) < 3:
        print(__doc__.strip().splitlines()[-4], file=sys.stderr)
        sys.exit(2)
    viewer = os.path.abspath(sys.argv[1])
    for needed in ("MemoryViz.js", "lib/d3@5.16.0.js"):
        if not os.path.isfile(os.path.join(viewer, needed)):
            print(f"memory_viz_viewer: FAILED: {viewer}: no {needed}: not the memory_viz viewer folder")
            sys.exit(1)
    if not os.access(CHROMIUM, os.X_OK):
        print(f"memory_viz_viewer: FAILED: no {CHROMIUM} (apt-get install chromium)")
        sys.exit(1)
    paths = pickles_of(sys.argv[2:])
    work = tempfile.mkdtemp(prefix="memory-viz-viewer-")
    failures = []
    started = time.monotonic()
    try:
        for path in paths:
            if not os.path.isfile(path):
                failures.append((path, "page", "no such file"))
                continue
            lines, found, seconds = check_pickle(path, work, viewer)
            for line in lines:
                print(line)
            print(f"{os.path.basename(path)}: {seconds:.1f} s in chromium", flush=True)
            failures += [(path, view, what) for view, what in found]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        for path, view, what in failures:
            print(f"memory_viz_viewer: FAILED: {path}: {view}: {what}")
        sys.exit(1)
    print(f"memory_viz_viewer: {len(paths)} pickles, all views drawn, no page error "
          f"({time.monotonic() - started:.1f} s)")


if __name__ == "__main__":
    main()
