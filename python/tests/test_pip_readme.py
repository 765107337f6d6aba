"""The README's pip lines, exactly as written, in a scratch folder holding a copy of the checkout's python/ and
plugins/pytorch/, with Debian's python3 and the package index: a fresh venv, a plain (isolated) install, then
torch 2.11.0 and the --no-build-isolation install that builds the extension against it, then the diagnostic. The
lines are read from the README, so the README cannot drift from what works."""
import os
import re
import shutil
import subprocess
import unittest
from pathlib import Path

from support import copy_package_sources, CLI, PYTHON_ROOT, scratch

README = PYTHON_ROOT.parent / "README.md"
MARKER = "<!-- python/tests/test_pip_readme.py runs these lines as they are -->"


def readme_lines() -> str:
    text = README.read_text()
    block = re.search(re.escape(MARKER) + r"\n```sh\n(.*?)\n```", text, re.S)
    if block is None:
        raise AssertionError(f"{README}: no ```sh block after {MARKER}")
    return block.group(1)


@unittest.skipUnless(CLI, "TEST_CLI names the built oomflight")
class ReadmePipLines(unittest.TestCase):
    def test_the_readmes_lines_install_the_package_and_build_the_extension(self):
        lines = readme_lines()
        self.assertIn("pip install --no-build-isolation ./python", lines)
        work = scratch()
        copy_package_sources(work)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OOMFLIGHT_", "PYTHON", "VIRTUAL_ENV"))}
        # Debian's python3 first (the README's newcomer), and the built `oomflight` beside its library.
        env["PATH"] = f"{Path(CLI).parent}:/usr/bin:/bin"
        out = subprocess.run(["bash", "-euxo", "pipefail", "-c", lines], cwd=work, env=env, capture_output=True,
                             text=True, timeout=1500)
        self.assertEqual(out.returncode, 0, out.stdout[-4000:] + out.stderr[-6000:])
        self.assertIn("built at install time, compiled against torch 2.11.0", out.stdout)
        self.assertIn("verified without a device: 9 of 9 torch TraceEntry actions", out.stdout)
        self.assertEqual(out.stdout.splitlines()[-1], "ok")
        site = next((work / "v" / "lib").glob("python3*/site-packages"))
        self.assertEqual(len(list((site / "oomflight").glob("_torch_ext*.so"))), 1)
        self.assertTrue((site / "oomflight" / "py.typed").is_file())
        # What the package says is public, and nothing it merely imports.
        out = subprocess.run([str(work / "v" / "bin" / "python"), "-c",
                              "import oomflight; print(sorted(n for n in dir(oomflight) if not n.startswith('_')))"],
                             cwd=work, env=env, capture_output=True, text=True, timeout=120)
        public = eval(out.stdout)  # noqa: S307 - our own process's repr of a list of names
        for helper in ("ctypes", "threading", "datetime", "Iterable", "Sequence"):
            self.assertNotIn(helper, public)
        import oomflight

        self.assertTrue(set(oomflight.__all__) <= set(public))
        shutil.rmtree(work / "v", ignore_errors=True)  # 5 GB


if __name__ == "__main__":
    unittest.main()
