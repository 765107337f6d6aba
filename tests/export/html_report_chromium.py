"""`oomflight report --html` in a real browser: the demo's 4-rank job (scripts/demo.sh: rank 2's 6 GiB device runs
out of memory, the others have 8 GiB) writes its archive, `oomflight report ARCHIVE --html` renders the page, and
Debian's headless Chromium loads it from a file:// URL with no network:

- the page names no http(s) URL and every src/href is a data: URL (it is self-contained), and is under 1 MB;
- the DOM after the scripts ran: body data-rendered="1" (set by the page's last script), the `errors` element empty
  (window.onerror writes there), no console line at all in Chromium's log (the page logs nothing, so any line is an
  error, a policy violation or a warning), the legend names rank 2 (out of memory) and ranks 0, 1 and 3, and both
  charts draw every rank;
- a screenshot (1400x2000) is written into the test's folder, checked to be a PNG of more than a few KB, and its
  path printed, for a person to look at.

Usage: html_report_chromium.py OOMFLIGHT_CLI
"""
import glob
import os
import re
import subprocess
import sys
from pathlib import Path
import tempfile

import headless_chromium
from headless_chromium import CHROMIUM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from fixtures import DEVICE_MEMORY, OWN_SNAPSHOT, SMALL_DEVICE_MEMORY  # noqa: E402  (tests/support)
CLI = os.path.abspath(sys.argv[1])
TRACE = OWN_SNAPSHOT  # the demo's step (tests/support/fixtures.py)
# No OOMFLIGHT_* setting of the caller may change the job; Open MPI refuses root without the two OMPI_ variables.
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("OOMFLIGHT_")},
       "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def fail(message):
    print(f"html_report_chromium: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def chromium(work, *args, timeout=120):
    """Runs headless Chromium (headless_chromium.py); returns (stdout, stderr), or fails the test."""
    out, err, failure = headless_chromium.run(work, args, timeout, env=ENV)
    if failure:
        fail(failure)
    return out, err


def main():
    if not os.access(CHROMIUM, os.X_OK):
        fail(f"no {CHROMIUM}: this test renders the page in Debian's chromium (scripts/bootstrap.sh installs it: "
             "apt-get install chromium)")
    if not os.path.isfile(TRACE):
        fail(f"no PyTorch snapshot at {TRACE}")
    work = tempfile.mkdtemp(prefix="oomflight-html-report-")

    # The demo's job, as scripts/demo.sh runs it (paced: every rank has recorded the model's parameters, 3.6 s before
    # the step, when rank 2 fails in it): it dies of rank 2's out-of-memory error by design.
    job = subprocess.run(["mpirun", "--oversubscribe", "-np", "4", CLI, "run", "--run-name", "t", "--", CLI, "replay",
                          TRACE, "--device-memory", DEVICE_MEMORY, "--rank-device-memory", f"2={SMALL_DEVICE_MEMORY}",
                          "--steps", "2", "--pace"],
                         cwd=work, env=ENV, capture_output=True, text=True, errors="replace", timeout=300)
    log = job.stdout + job.stderr
    if job.returncode == 0:
        fail("the job should have died of rank 2's out-of-memory error\n" + log[-3000:])
    if "rank 2 out of memory at batch 0" not in log:
        fail(f"the job exited with {job.returncode}, but not of rank 2's out-of-memory error\n" + log[-3000:])
    archives = glob.glob(os.path.join(work, "**", "*.h5"), recursive=True)
    if len(archives) != 1:
        fail(f"expected exactly one archive under {work}, found {archives}\n" + log[-3000:])

    page = os.path.join(work, "out.html")
    report = subprocess.run([CLI, "report", archives[0], "--html", page], cwd=work, env=ENV, capture_output=True,
                            text=True, errors="replace", timeout=120)
    if report.returncode != 0 or "origin: rank 2" not in report.stdout:
        fail(f"report exited with {report.returncode}\n{report.stdout[-2000:]}\n{report.stderr[-2000:]}")
    if os.path.exists(page + ".tmp"):
        fail(f"{page}.tmp was left behind")
    html = open(page, encoding="utf-8").read()
    size = os.path.getsize(page)
    print(f"html_report_chromium: {page}: {size} bytes")
    if size >= 1_000_000:
        fail(f"the page is {size} bytes, more than 1 MB")

    # Self-contained: nothing on the network, and nothing but data: URLs in src or href.
    urls = re.findall(r"https?://[^\s\"'<>]*", html)
    if urls:
        fail(f"the page names URLs: {urls[:5]}")
    for value in re.findall(r"\b(?:src|href)\s*=\s*[\"']?([^\"'\s>]*)", html):
        if not value.startswith("data:"):
            fail(f"the page refers to {value!r}")

    url = "file://" + page
    dom, log = chromium(work, "--dump-dom", url)
    body = re.search(r"<body[^>]*>", dom)
    if body is None or 'data-rendered="1"' not in body.group(0):
        fail(f"the page's scripts did not finish: {body.group(0) if body else 'no <body>'}")
    errors = re.search(r'<pre id="errors"[^>]*>(.*?)</pre>', dom, re.S)
    if errors is None:
        fail("no element with id errors in the DOM")
    if errors.group(1).strip():
        fail(f"the page's script failed: {errors.group(1).strip()}")
    console = [line for line in log.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    if console:
        fail("chromium logged console output:\n" + "\n".join(console))
    legend = re.search(r'<ul class="legend">(.*?)</ul>', dom, re.S)
    if legend is None:
        fail("no legend in the DOM")
    if not re.search(r'<li class="origin">.*?</span>rank 2 \(out of memory\)</li>', legend.group(1)):
        fail(f"the legend does not mark rank 2 as out of memory: {legend.group(1)}")
    for rank in (0, 1, 3):
        if not re.search(rf"</span>rank {rank}</li>", legend.group(1)):
            fail(f"the legend does not name rank {rank}: {legend.group(1)}")
    charts = re.findall(r'<svg class="chart".*?</svg>', dom, re.S)
    if len(charts) != 2:
        fail(f"expected 2 charts (allocated, reserved), found {len(charts)}")
    for chart in charts:
        for rank in range(4):
            if not re.search(rf'<g class="series[^"]*" data-rank="{rank}"[^>]*>(?:<title>[^<]*</title>)?<polyline',
                             chart):
                fail(f"a chart has no curve for rank {rank}")
        if "rank 2 out of memory at" not in chart:
            fail("a chart does not mark rank 2's out-of-memory event")

    screenshot = os.path.join(work, "report.png")
    chromium(work, f"--screenshot={screenshot}", "--window-size=1400,2000", url)
    if not os.path.isfile(screenshot):
        fail(f"chromium wrote no screenshot at {screenshot}")
    with open(screenshot, "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            fail(f"{screenshot} is not a PNG")
    if os.path.getsize(screenshot) < 20_000:
        fail(f"{screenshot} is {os.path.getsize(screenshot)} bytes: a blank page?")
    # The archive is large and can be made again; the page and the screenshot stay for a person to look at.
    os.remove(archives[0])
    print(f"html_report_chromium: screenshot: {screenshot} ({os.path.getsize(screenshot)} bytes)")
    print("html_report_chromium: ok")


if __name__ == "__main__":
    main()
