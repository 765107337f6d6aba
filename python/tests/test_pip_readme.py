"""The README's pip lines, exactly as written, in a scratch folder laid out as a clone (support.copy_package_sources),
with Debian's python3 and the package index, and nothing from the CMake build on PATH or in the environment: a
fresh venv and a plain (isolated) install, which builds liboomflight and the `oomflight` command; then torch 2.11.0
and the --no-build-isolation install, which also builds the torch extension against it; then the diagnostic. After
them, what the issue asked of a newcomer's install (issue 31): `oomflight --version`, and `mpirun -np 2 oomflight
run -- python -c "import torch"` with the package's own library. The lines are read from the README, so the
README cannot drift from what works. Both installs share CMake's build folder (SKBUILD_BUILD_DIR, a
scikit-build-core setting), so that the second compiles only the extension."""
import os
import re
import shutil
import subprocess
import unittest
from pathlib import Path

from support import MPIRUN_ENV, PYTHON_ROOT, copy_package_sources, scratch

README = PYTHON_ROOT.parent / "README.md"
MARKER = "<!-- python/tests/test_pip_readme.py runs these lines as they are -->"


def readme_lines() -> str:
    text = README.read_text()
    block = re.search(re.escape(MARKER) + r"\n```sh\n(.*?)\n```", text, re.S)
    if block is None:
        raise AssertionError(f"{README}: no ```sh block after {MARKER}")
    return block.group(1)


class ReadmePipLines(unittest.TestCase):
    def test_the_readmes_lines_install_a_whole_oomflight(self):
        lines = readme_lines().splitlines()
        self.assertEqual(lines[0], "python3 -m venv v && v/bin/pip install ./python")
        self.assertIn("v/bin/pip install --no-build-isolation ./python", lines)
        work = scratch()
        copy_package_sources(work)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OOMFLIGHT_", "PYTHON", "VIRTUAL_ENV"))}
        env["PATH"] = "/usr/bin:/bin"  # Debian's python3 (the README's newcomer); no oomflight but the package's
        env["SKBUILD_BUILD_DIR"] = str(work / "cmake-build")
        env.update(MPIRUN_ENV)

        def bash(script: str, timeout: float) -> subprocess.CompletedProcess:
            return subprocess.run(["bash", "-euxo", "pipefail", "-c", script], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=timeout)

        # The plain install alone: the library and the command, no torch, no extension.
        out = bash(lines[0], 1200)
        self.assertEqual(out.returncode, 0, out.stdout[-4000:] + out.stderr[-6000:])
        site = next((work / "v" / "lib").glob("python3*/site-packages"))
        package = site / "oomflight"
        self.assertTrue(os.access(package / "bin" / "oomflight", os.X_OK), sorted(p.name for p in package.iterdir()))
        # One library file (a wheel has no symlinks for a soname's chain), and NCCL's plugin where NCCL is.
        self.assertEqual(sorted(p.name for p in (package / "lib").glob("liboomflight*")), ["liboomflight.so"])
        self.assertEqual((package / "lib" / "libnccl-profiler-oomflight.so").is_file(),
                         Path("/usr/local/cuda/include/nccl.h").is_file())
        self.assertEqual(list(package.glob("_torch_ext*.so")), [])
        self.assertEqual(sorted(p.name for p in (package / "_torch_plugin").iterdir()),
                         ["context_table.hpp", "job_store.hpp", "oomflight_torch.cpp", "python_stacks.hpp",
                          "python_thread.hpp", "trace_tracker.hpp"])
        self.assertFalse((package / "share").exists(), "a second copy of the package inside the package")
        out = bash("v/bin/oomflight --version && v/bin/python -c 'import oomflight._capi as c; "
                   "print(c.library()._oomflight_path)'", 120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertEqual(out.stdout.splitlines(), ["oomflight 0.2.0", str(package / "lib" / "liboomflight.so")])

        # torch, the install that builds the extension against it, and the diagnostic.
        out = bash("\n".join(lines[1:]), 1500)
        self.assertEqual(out.returncode, 0, out.stdout[-4000:] + out.stderr[-6000:])
        self.assertIn("built at install time, compiled against torch 2.11.0", out.stdout)
        self.assertIn("verified without a device: 9 of 9 torch TraceEntry actions", out.stdout)
        self.assertEqual(out.stdout.splitlines()[-1], "ok")
        self.assertEqual(len(list(package.glob("_torch_ext*.so"))), 1)
        self.assertTrue((package / "py.typed").is_file())

        # `oomflight` on the environment's PATH, under mpirun, with nothing from the CMake build anywhere.
        env["PATH"] = f"{work / 'v' / 'bin'}:/usr/bin:/bin"
        out = bash("oomflight --version && mpirun --oversubscribe -np 2 oomflight run -- python -c "
                   "'import torch, oomflight._capi as c; print(c.library()._oomflight_path, torch.__version__)'", 300)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertEqual(out.stdout.splitlines()[0], "oomflight 0.2.0")
        ranks = [line.split() for line in out.stdout.splitlines()[1:]]
        self.assertEqual([r[0] for r in ranks], [str(package / "lib" / "liboomflight.so")] * 2, out.stdout + out.stderr)
        self.assertTrue(all(r[1].startswith("2.11.0") for r in ranks), out.stdout)
        self.assertNotIn("error", out.stdout + out.stderr)

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
