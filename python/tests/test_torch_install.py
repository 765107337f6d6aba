"""The sdist, and the package with its torch extension built ahead of time from it, as a user without network
installs it into an environment that holds torch: the sdist (scikit-build-core's, from a copy of the checkout laid
out as a clone) holds the C++ tree and no tests; `pip install --no-index --no-build-isolation` of it builds
liboomflight, the `oomflight` command and the extension against the environment's torch 2.11.0; then `python -m
oomflight.torch --check` with no compiler on PATH, and the package drives its own library from an unrelated
folder. Runs in the real-torch environment (scripts/python_envs.sh) and leaves the installed package in
TEST_TORCH_SITE for the other real-torch tests (a ctest fixture)."""
import os
import shutil
import tarfile
import textwrap
import unittest
from pathlib import Path

from support import PY, PYTHON_ROOT, TORCH_SITE, child_env, copy_package_sources, read_archive, run, scratch

TORCH_VERSION = "2.11.0"  # python/requirements/torch.txt


class AheadOfTimeBuild(unittest.TestCase):
    def test_pip_builds_the_whole_package_from_the_sdist_and_check_needs_no_compiler(self):
        self.assertTrue(TORCH_SITE, "TEST_TORCH_SITE names the folder to install into")
        work = scratch()
        source = copy_package_sources(work / "src")
        env = child_env()
        env.pop("PYTHONPATH")
        sdist_of = "import sys; from scikit_build_core.build import build_sdist; print(build_sdist(sys.argv[1]))"
        out = run([PY, "-c", sdist_of, str(work / "dist")], source, env, timeout=300)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        sdist = work / "dist" / out.stdout.split()[-1]
        with tarfile.open(sdist) as tar:
            members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}
        for name in ("pyproject.toml", "oomflight/__init__.py", "oomflight/_bootstrap/sitecustomize.py",
                     "cpp/CMakeLists.txt", "cpp/cmake/dependencies.cmake", "cpp/core/CMakeLists.txt",
                     "cpp/launcher/main.cpp", "cpp/plugins/pytorch/oomflight_torch.cpp",
                     "cpp/plugins/nccl/CMakeLists.txt"):
            self.assertIn(name, members, sorted(members)[:40])
            self.assertTrue(members[name].isfile(), f"{name} is stored as a link, not a file")
        self.assertEqual([n for n in members if n.startswith("tests/") or "__pycache__" in n], [])

        site = Path(TORCH_SITE)
        shutil.rmtree(site, ignore_errors=True)
        # CMake's build folder inside pip's unpacked sdist (relative: scikit-build-core's setting, resolved there), so
        # that ccache finds this build's objects in the next clone's (cmake/ccache.cmake).
        out = run([PY, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps",
                   "--disable-pip-version-check", "--target", str(site), str(sdist)], work,
                  {**env, "SKBUILD_BUILD_DIR": "build/torch-install"}, timeout=1200)
        self.assertEqual(out.returncode, 0, out.stdout[-4000:] + out.stderr[-4000:])
        package = site / "oomflight"
        built = sorted(p.name for p in package.glob("_torch_ext*.so"))
        self.assertEqual(len(built), 1, sorted(p.name for p in package.iterdir()))
        self.assertTrue((package / "py.typed").is_file())
        self.assertTrue(os.access(package / "bin" / "oomflight", os.X_OK))
        self.assertTrue((site / "bin" / "oomflight").is_file(), "the console script")
        # This tree's list (oomflight/_extension.py, SOURCES), which plugins/pytorch/sources.cmake must match.
        import importlib.util

        spec = importlib.util.spec_from_file_location("tree_extension", PYTHON_ROOT / "oomflight" / "_extension.py")
        tree = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tree)
        self.assertEqual(sorted(p.name for p in (package / "_torch_plugin").iterdir()), sorted(tree.SOURCES))
        self.drives_its_own_library(site)
        # What a build at first use reads (a torch installed later): the installed copies, every one of them.
        out = run([PY, "-c", "import oomflight._extension as e; print(e.source_dir())"], scratch(),
                  child_env(PYTHONPATH=str(site)))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), str(package / "_torch_plugin"))

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

    def drives_its_own_library(self, site: Path):
        # From an unrelated folder, with no OOMFLIGHT_LIBRARY and no `oomflight` on PATH: the package loads the
        # library beside it and dumps through it.
        env = child_env(PYTHONPATH=str(site), PATH=str(Path(PY).parent) + ":/usr/bin:/bin")
        env.pop("OOMFLIGHT_LIBRARY")
        out = run([PY, "-c", textwrap.dedent("""
            import oomflight, oomflight._capi as c
            oomflight.init(run_name="pip", folder="out")
            oomflight.record("segment_alloc", 0, 0x2000000, 2 << 20)
            print(c.library()._oomflight_path)
            print(oomflight.request_dump("signal").path)
            """)], scratch(), env)
        self.assertEqual(out.returncode, 0, out.stderr)
        library, path = out.stdout.splitlines()
        self.assertEqual(library, str(site / "oomflight" / "lib" / "liboomflight.so"))
        a = read_archive(Path(path))
        self.assertEqual(len(a["events"]), 1)
        self.assertEqual(int(a["events"]["size"][0]), 2 << 20)

    def stale_builds_are_not_loaded(self):
        # ahead_of_time() compares the build's torch with the running one: a stale build would crash at import
        # or, worse, misread torch's structs.
        out = run([PY, "-c", "import torch, types, oomflight._extension as e\n"
                   "fake = types.SimpleNamespace(__version__='9.9.0+cu999')\n"
                   "m, why = e.ahead_of_time(fake)\nprint(m, why)"], scratch(), child_env(PYTHONPATH=TORCH_SITE))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), f"None the build made at install time is for torch {TORCH_VERSION}, "
                                             "this process runs 9.9.0+cu999")


class TheTreesPackage(unittest.TestCase):
    def test_check_builds_the_trees_extension_ahead_of_the_jobs_that_use_it(self):
        # `oomflight run` from the build tree loads the tree's package (python/), which has no install-time build: its
        # extension is built at first use, beside the job (not coordinated until it is done). The tests' jobs under
        # `oomflight run` coordinate from their first seconds, so this fixture builds it ahead, as the first use's
        # log tells a user to: `python -m oomflight.torch --check`, into torch's cache, where those jobs load it.
        env = child_env()
        env["PYTHONPATH"] = str(PYTHON_ROOT)
        out = run([PY, "-m", "oomflight.torch", "--check"], scratch(), env, timeout=900)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr[-3000:])
        self.assertIn("built at first use", out.stdout)
        self.assertTrue(out.stdout.rstrip().endswith("ok"), out.stdout)


if __name__ == "__main__":
    unittest.main()
