"""The figures of an out-of-memory error, true to where they came from, with the real torch on the CPU (issue 30):

1. A per-process cap (torch.cuda.set_per_process_memory_fraction) is not the device. torch hands its OOM observers
   `set_fraction ? allowed_memory_maximum : device_total`: the extension's observer body is fed the figures an H200
   gives with a 4 GiB cap (device 139.80 GiB, 133.65 GiB free), and the archive, the log and the report must say the
   device's capacity and free memory as the driver gives them and the cap apart, with headroom against the cap.
   Before: "GPU 0 has a total capacity of 4.00 GiB of which 133.65 GiB is free", "device free 133.65 GiB of 4.00 GiB".
2. An OutOfMemoryError that only the excepthook saw (no allocator hook: a CPU job) is archived with the figures its
   message states, and the log, the archive and the report say they came from the message. Before: "requested 0 B,
   0 B free" beside a message saying "Tried to allocate 2.00 GiB".
"""
import json
import re
import textwrap
import unittest

from support import CLI, PY, TORCH_SITE, child_env, read_archive, run, scratch

GiB = 1 << 30
CAPACITY = 150_110_011_392  # an H200's total_memory: 139.80 GiB
FREE = int(133.65 * GiB)
CAP = 4 * GiB

OBSERVER_JOB = textwrap.dedent(f"""
    import json, torch, oomflight, oomflight._extension as ext, oomflight.torch as ot
    oomflight.init(run_name="capped", folder="out")
    m = ext.load(torch)
    # Seeded as install() seeds it: the device's total_memory from its properties.
    assert m.attach(ot._function_addresses(), [(0, 0, 0, {CAPACITY})], False, 0) == ""
    stats = [3 * {GiB} + 7, int(3.9 * {GiB}), 3 * {GiB} + 7, int(3.9 * {GiB})]
    # What torch's allocator hands the observer under a 4 GiB cap: the cap in place of the device's total.
    why = m._observe(0, 2 * {GiB}, {CAP}, {FREE}, stats, [], False)
    assert why == "", why
    print(json.dumps({{"path": oomflight._capi.library().oomflight_last_dump_path().decode()}}))
""")

MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
           "1.23 GiB is free. Including non-PyTorch memory, this process has 77.95 GiB memory in use. Of the "
           "allocated memory 76.80 GiB is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but unallocated.")

EXCEPTHOOK_JOB = textwrap.dedent(f"""
    import torch, oomflight, oomflight.oom
    oomflight.init(run_name="hooked", folder="out")
    oomflight.oom.install_excepthook()
    raise torch.OutOfMemoryError({MESSAGE!r})
""")


class OomFigures(unittest.TestCase):
    def setUp(self):
        self.assertTrue(TORCH_SITE, "TEST_TORCH_SITE: the package installed with its extension")

    def report(self, path, cwd):
        out = run([CLI, "report", path], cwd, child_env())
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout

    def test_a_per_process_cap_is_kept_apart_from_the_device(self):
        cwd = scratch()
        (cwd / "job.py").write_text(OBSERVER_JOB)
        out = run([PY, "job.py"], cwd, child_env())
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        path = json.loads(out.stdout.splitlines()[-1])["path"]
        a = read_archive(path)
        row = a["ranks"][0]
        self.assertEqual(int(row["device_capacity_bytes"]), CAPACITY)
        self.assertEqual(int(row["device_free_bytes"]), FREE)
        self.assertEqual(int(row["memory_cap_bytes"]), CAP)
        self.assertEqual(int(row["oom_requested_bytes"]), 2 * GiB)
        self.assertEqual(int(row["numbers_from_message"]), 0)  # the allocator's own figures
        self.assertEqual(a["attrs"]["reason"],
                         "rank 0: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                         "139.80 GiB of which 133.65 GiB is free. 4.00 GiB allowed; "
                         "(torch.cuda.set_per_process_memory_fraction)")
        self.assertNotIn("of 4.00 GiB", out.stderr)
        text = self.report(path, cwd)
        self.assertIn("  rank 0 at batch -1: requested 2.00 GiB, device free 133.65 GiB of 139.80 GiB; this process "
                      "may use 4.00 GiB of it (its per-process cap, torch's memory fraction)\n", text)
        # Headroom against the cap: 4.00 GiB - 3.90 GiB reserved.
        table = re.search(r"^\s+0\s+-1\s.*$", text, re.M).group(0)
        self.assertIn("4.00 GiB cap", table)
        self.assertIn("102.40 MiB", table)
        self.assertNotIn("of 4.00 GiB\n", text)

    def test_an_error_only_the_excepthook_saw_gives_the_figures_its_message_states(self):
        cwd = scratch()
        (cwd / "job.py").write_text(EXCEPTHOOK_JOB)
        out = run([PY, "job.py"], cwd, child_env())
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", out.stderr)
        self.assertIn("rank 0 out of memory at batch -1 (requested 2.00 GiB, 1.23 GiB free, as the error's message "
                      "states them)", out.stderr)
        self.assertNotIn("requested 0 B", out.stderr)
        paths = sorted((cwd / "hooked" / "out").glob("*.h5")) or sorted((cwd / "out").glob("*.h5"))
        self.assertEqual(len(paths), 1, out.stderr)
        row = read_archive(paths[0])["ranks"][0]
        self.assertEqual(int(row["oom_requested_bytes"]), 2 * GiB)
        self.assertEqual(int(row["device_capacity_bytes"]), int(79.19 * GiB + 0.5))
        self.assertEqual(int(row["device_free_bytes"]), int(1.23 * GiB + 0.5))
        self.assertEqual(int(row["memory_cap_bytes"]), 0)
        self.assertEqual(int(row["numbers_from_message"]), 1 | 2)
        text = self.report(str(paths[0]), cwd)
        self.assertIn("requested 2.00 GiB, device free 1.23 GiB of 79.19 GiB (the request, the device's figures as "
                      "the error's message states them: no allocator hook saw the failure)", text)


if __name__ == "__main__":
    unittest.main()
