"""Text from the job reaches no terminal raw (issue 30, item 6). A real process, through the Python package and the
C API, records what a hostile or careless job can set: a communicator name (NCCL's commName) that retitles the
window and clears the screen, a dump reason with a colour sequence, a carriage return and a forged log line, a
metadata value with an 8-bit CSI, a function name with a right-to-left override, a folder name with ESC, bytes that
are not UTF-8, and its own command line. Then `oomflight report` (text and --html) and the folded and Perfetto
exports read the archive.

What must hold: no byte that acts on a terminal (C0 controls other than the line feed, DEL, the C1 controls, the
bidirectional overrides) in the job's stderr (oomflight's log lines), the report's stdout or stderr, the folded
file or the HTML page; each hostile string appears there as its visible escape ("\\x1b]0;pwned\\x07\\x1b[2J"); no
line of the report or of the log was forged; the Perfetto trace is JSON that parses and carries the reason exactly
(JSON escapes for its own medium). Before (as issue 30 measured it), the report printed a communicator name raw; the
folded export passed the override and ESC through until this test.

Usage: hostile_text.py OOMFLIGHT_CLI LIBOOMFLIGHT PYTHON_PACKAGE_ROOT
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

CLI = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ""
LIBRARY = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else ""
PACKAGE_ROOT = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else ""

COMM = "\x1b]0;pwned\x07\x1b[2J"
REASON = "boom \x1b[31mred\x1b[0m\rrank 7: forged\nrank 9: forged too"
FUNCTION = "forward\u202egnp.exe"
FOLDER = "out\x1b[2J"

JOB = textwrap.dedent("""
    import ctypes, sys
    import oomflight
    from oomflight import _capi
    comm, reason, function, folder = sys.argv[1:5]
    oomflight.init(run_name="hostile", folder=folder)
    lib = _capi.library()
    # A metadata value with an 8-bit CSI (U+009B) and a byte that is not UTF-8, through the C API as bytes.
    assert lib.oomflight_set_metadata(b"note", "\\u009b31m csi ".encode() + b"\\xff") == 0
    stack = oomflight.intern_stack([(function, "train.py", 3)])
    oomflight.record("alloc", 0, 0x1000, 1 << 20, stack_id=stack)

    class Collective(ctypes.Structure):  # struct oomflight_collective (oomflight.h)
        _fields_ = [("struct_size", ctypes.c_uint32), ("op", ctypes.c_int32), ("comm_id", ctypes.c_uint64),
                    ("seq", ctypes.c_uint64), ("count", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                    ("stream", ctypes.c_uint64), ("datatype", ctypes.c_int32), ("peer", ctypes.c_int32),
                    ("phase", ctypes.c_int32), ("flags", ctypes.c_uint32)]
    assert lib.oomflight_register_communicator(ctypes.c_uint64(0x1234), comm.encode(), 0, 1) == 0
    c = Collective(ctypes.sizeof(Collective), 0, 0x1234, 0, 256, 1024, 0, 7, -1, 0, 0)  # allreduce #0 entered
    assert lib.oomflight_record_collective(ctypes.byref(c)) == 0
    oomflight.log("warn", reason)
    r = oomflight.request_dump("signal", reason=reason)
    print(r.status, r.path)
""")

# What a terminal acts on: C0 controls but the line feed, DEL, C1 controls, bidirectional embeddings, overrides and
# isolates.
ACTS = re.compile("[\x00-\x09\x0b-\x1f\x7f\x80-\x9f\u202a-\u202e\u2066-\u2069]")


class HostileText(unittest.TestCase):
    def setUp(self):
        if not CLI:
            self.skipTest("usage: hostile_text.py OOMFLIGHT_CLI LIBOOMFLIGHT PYTHON_PACKAGE_ROOT")
        self.work = Path(tempfile.mkdtemp(prefix="oomflight-hostile-text-"))
        self.addCleanup(shutil.rmtree, self.work, True)

    def assert_inert(self, what: str, data: bytes):
        text = data.decode("utf-8", "replace")
        found = ACTS.search(text)
        self.assertIsNone(found, f"{what}: {found and repr(found.group())} at {found and found.start()}:\n{text!r}"[:3000])

    def run_ok(self, *args):
        r = subprocess.run([CLI, *args], cwd=self.work, capture_output=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr.decode("utf-8", "replace"))
        return r

    def test_every_medium_escapes_the_jobs_text(self):
        (self.work / "job.py").write_text(JOB)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("OOMFLIGHT_")},
               "OOMFLIGHT_LIBRARY": LIBRARY, "PYTHONPATH": PACKAGE_ROOT}
        # The job's own command line carries the sequences too (the archive records it).
        job = subprocess.run([sys.executable, "job.py", COMM, REASON, FUNCTION, FOLDER], cwd=self.work, env=env,
                             capture_output=True, timeout=120)
        self.assertEqual(job.returncode, 0, job.stderr)
        status, path = job.stdout.decode().strip().split(" ", 1)
        self.assertEqual(status, "archive", job.stderr)
        self.assertTrue(Path(path).is_file(), path)
        # The log: the warning and the dump's lines quote the reason and the folder, escaped, one line each.
        self.assert_inert("the job's stderr", job.stderr)
        log = job.stderr.decode()
        self.assertIn("oomflight[rank 0] warning: boom \\x1b[31mred\\x1b[0m\\rrank 7: forged\\nrank 9: forged too\n", log)
        self.assertIn("out\\x1b[2J", log)
        self.assertNotRegex(log, r"(?m)^rank [79]: forged")

        report = self.run_ok("report", path, "--html", "report.html")
        self.assert_inert("the report's stdout", report.stdout)
        self.assert_inert("the report's stderr", report.stderr)
        text = report.stdout.decode()
        self.assertIn("communicator '\\x1b]0;pwned\\x07\\x1b[2J'", text)
        self.assertIn("\n    boom \\x1b[31mred\\x1b[0m\\rrank 7: forged\\nrank 9: forged too\n", text)
        self.assertIn("note=\\u009b31m csi \\xff", text)
        self.assertIn("forward\\u202egnp.exe (train.py:3)", text)
        self.assertIn("out\\x1b[2J", text)  # the archive's path
        self.assertNotRegex(text, r"(?m)^rank [79]: forged")
        # The command line the archive recorded, escaped as well.
        self.assertRegex(text, r"ran on .*: .*job\.py \\x1b\]0;pwned\\x07\\x1b\[2J ")

        page = (self.work / "report.html").read_bytes()
        self.assert_inert("the HTML page", page.replace(b"\t", b" "))
        self.assertIn("communicator &#39;\\x1b]0;pwned\\x07\\x1b[2J&#39;", page.decode())

        self.run_ok("export", path, "--format", "folded", "-o", "live.folded")
        folded = (self.work / "live.folded").read_bytes()
        self.assert_inert("the folded stacks", folded)
        self.assertEqual(len(folded.decode().splitlines()), 1, folded)
        self.assertIn("forward\\u202egnp.exe (train.py:3) 1048576", folded.decode())

        self.run_ok("export", path, "--format", "perfetto", "-o", "trace.json")
        raw = (self.work / "trace.json").read_bytes()
        self.assert_inert("the Perfetto JSON text", raw)
        trace = json.loads(raw)
        self.assertEqual(trace["otherData"]["reason"], "rank 0: " + REASON)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
