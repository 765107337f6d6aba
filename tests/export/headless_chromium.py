"""Debian's headless Chromium, run the way the export tests need it: a profile of its own (deleted after), HOME in
the work folder, its log on stderr, 5 s of virtual time for the page's scripts, and a hard time limit that kills
it with every process it started (its own process group). Shared by html_report_chromium.py and
memory_viz_viewer.py."""
import os
import shutil
import signal
import subprocess
import tempfile

CHROMIUM = "/usr/bin/chromium"


def run(work, args, timeout, env=None):
    """Runs Chromium with `args` after the common flags. Returns (out, err, failure): failure is None, or why the run
    failed (past `timeout` seconds, or a non-zero exit with the end of its log)."""
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=work)
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
           "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                            start_new_session=True, env={**(os.environ if env is None else env), "HOME": work})
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return out, err, f"chromium ran past its {timeout} s limit: {' '.join(cmd)}"
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if proc.returncode != 0:
        return out, err, f"chromium exited with {proc.returncode}: {' '.join(cmd)}\n{err[-3000:]}"
    return out, err, None
