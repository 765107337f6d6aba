"""`pip install` from the source tree, offline (no index, no build isolation), as a user without network does;
then the installed package, from an unrelated folder, carries the torch extension's sources and drives the
library. A copy of the tree is installed so that the build leaves nothing in the checkout."""
import os
import textwrap
import unittest
from pathlib import Path

from support import copy_package_sources, PY, child_env, read_archive, run, scratch


class PipInstall(unittest.TestCase):
    def test_installs_offline_and_works_from_anywhere(self):
        work = scratch()
        copy_package_sources(work / "src")
        target = work / "site"
        env = child_env()
        env.pop("PYTHONPATH")
        out = run([PY, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps", "--quiet",
                   "--target", str(target), str(work / "src" / "python")], work, env, timeout=300)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        plugin = target / "oomflight" / "_torch_plugin"
        self.assertTrue((plugin / "oomflight_torch.cpp").is_file(), sorted(p.name for p in target.rglob("*")))
        self.assertTrue((plugin / "trace_tracker.hpp").is_file())
        self.assertTrue((plugin / "context_table.hpp").is_file())
        elsewhere = scratch()
        env["PYTHONPATH"] = str(target)
        out = run([PY, "-c", textwrap.dedent("""
            import oomflight, oomflight._extension as ext
            print(oomflight.__file__)
            print(ext.source_dir())
            oomflight.init(run_name="pip", folder="out")
            oomflight.record("segment_alloc", 0, 0x2000000, 2 << 20)
            print(oomflight.request_dump("signal").path)
            """)], elsewhere, env)
        self.assertEqual(out.returncode, 0, out.stderr)
        module, sources, path = out.stdout.splitlines()
        self.assertTrue(module.startswith(str(target)), module)
        self.assertEqual(Path(sources), plugin)
        a = read_archive(Path(path))
        self.assertEqual(len(a["events"]), 1)
        self.assertEqual(int(a["events"]["size"][0]), 2 << 20)


if __name__ == "__main__":
    unittest.main()
