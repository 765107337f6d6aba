"""The package with its torch extension built ahead of time, as a user installs it into an environment that holds
torch: `pip install --no-build-isolation` (torch's own BuildExtension, against the environment's torch 2.11.0),
then `python -m oomflight.torch --check` with no compiler on PATH. Runs in the real-torch environment
(scripts/python_envs.sh) and leaves the installed package in TEST_TORCH_SITE for the other real-torch tests (a
ctest fixture). A copy of the tree is installed, so that the build leaves nothing in the checkout."""
import os
import shutil
import unittest
from pathlib import Path

from support import copy_package_sources, PY, PYTHON_ROOT, TORCH_SITE, child_env, run, scratch

TORCH_VERSION = "2.11.0"  # python/requirements/torch.txt


class AheadOfTimeBuild(unittest.TestCase):
    def test_pip_builds_the_extension_against_the_environments_torch_and_check_needs_no_compiler(self):
        self.assertTrue(TORCH_SITE, "TEST_TORCH_SITE names the folder to install into")
        work = scratch()
        copy_package_sources(work / "src")
        site = Path(TORCH_SITE)
        shutil.rmtree(site, ignore_errors=True)
        env = child_env()
        env.pop("PYTHONPATH")
        out = run([PY, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--disable-pip-version-check",
                   "--target", str(site), str(work / "src" / "python")], work, env, timeout=900)
        self.assertEqual(out.returncode, 0, out.stdout[-4000:] + out.stderr[-4000:])
        built = sorted(p.name for p in (site / "oomflight").glob("_torch_ext*.so"))
        self.assertEqual(len(built), 1, sorted(p.name for p in (site / "oomflight").iterdir()))
        self.assertTrue((site / "oomflight" / "py.typed").is_file())

        # The diagnostic, from an unrelated folder, with nothing but the interpreter's own folder on PATH: no
        # compiler, so the extension it loads can only be the one built at install time.
        no_compiler = {k: v for k, v in env.items() if k not in ("CXX", "CC")}
        no_compiler["PATH"] = str(Path(PY).parent)
        no_compiler["PYTHONPATH"] = str(site)
        self.assertIsNone(shutil.which("c++", path=no_compiler["PATH"]))
        out = run([PY, "-m", "oomflight.torch", "--check"], scratch(), no_compiler)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        lines = out.stdout.splitlines()
        self.assertIn(f"torch: {TORCH_VERSION}+", out.stdout)
        extension = next(line for line in lines if line.startswith("extension: "))
        self.assertEqual(Path(extension.split(": ", 1)[1]), site / "oomflight" / built[0])
        self.assertIn(f"built at install time, compiled against torch {TORCH_VERSION}", out.stdout)
        self.assertIn("verified without a device: 9 of 9 torch TraceEntry actions", out.stdout)
        self.assertIn("carrying 1 segment and 1 block", out.stdout)
        self.assertIn("device: none (torch.cuda.is_available() is False)", out.stdout)
        self.assertEqual(lines[-1], "ok")

        # Without liboomflight the check says what is missing and fails.
        missing = dict(no_compiler, OOMFLIGHT_LIBRARY=str(work / "no-such-liboomflight.so"))
        out = run([PY, "-m", "oomflight.torch", "--check"], scratch(), missing)
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("liboomflight: MISSING: cannot find liboomflight", out.stdout)
        self.assertIn("no-such-liboomflight.so (absent)", out.stdout)

        self.stale_builds_are_not_loaded()

    def stale_builds_are_not_loaded(self):
        # ahead_of_time() compares the build's torch with the running one: a stale build would crash at import
        # or, worse, misread torch's structs.
        out = run([PY, "-c", "import torch, types, oomflight._extension as e\n"
                   "fake = types.SimpleNamespace(__version__='9.9.0+cu999')\n"
                   "m, why = e.ahead_of_time(fake)\nprint(m, why)"], scratch(), child_env(PYTHONPATH=TORCH_SITE))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), f"None the build made at install time is for torch {TORCH_VERSION}, "
                                             "this process runs 9.9.0+cu999")


if __name__ == "__main__":
    unittest.main()
