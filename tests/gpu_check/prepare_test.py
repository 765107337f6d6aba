"""The GPU check's prepare step (scripts/gpu_check/prepare.sh), as CI runs it: the folder it makes fits the device
machine's 64 MiB, and with this machine's own Open MPI hidden (a private mount namespace binds empty folders over
its libraries, components and data files, as on the GPU machine, which has none) the folder's mpirun and CLI run
the demo: 2 ranks, rank 1 out of memory, one archive of both ranks naming rank 1. Usage:
    prepare_test.py SOURCE_DIR BUILD_DIR"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import h5py

SOURCE, BUILD = (Path(a).resolve() for a in sys.argv[1:3]) if len(sys.argv) > 2 else (None, None)
HIDDEN = ["/usr/lib/x86_64-linux-gnu/openmpi", "/usr/share/openmpi", "/etc/openmpi"]
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("OOMFLIGHT_", "OMPI_", "OPAL_"))}


class Prepare(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if SOURCE is None:
            raise unittest.SkipTest("usage: prepare_test.py SOURCE_DIR BUILD_DIR")
        cls.work = Path(tempfile.mkdtemp(prefix="oomflight-gpu-check-"))
        cls.bundle = cls.work / "gpu-check"
        r = subprocess.run([SOURCE / "scripts/gpu_check/prepare.sh", BUILD, cls.bundle], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        cls.prepare_out = r.stdout

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def test_the_folder_fits_the_device_and_carries_no_c_runtime(self):
        size = sum(p.lstat().st_size for p in self.bundle.rglob("*"))
        self.assertLess(size, 64 << 20, self.prepare_out)
        libs = sorted(p.name for p in (self.bundle / "lib").iterdir())
        for name in ("liboomflight.so", "libmpi.so.40", "libhdf5_openmpi.so.103", "libopen-pal.so.40"):
            self.assertIn(name, libs)
        for name in libs:
            self.assertFalse(name.startswith(("libc.so", "libstdc++", "libgcc_s", "ld-linux")), name)

    def test_its_mpirun_and_cli_run_the_demo_without_this_machines_open_mpi(self):
        trace = SOURCE / "examples/pytorch/snapshots/h200-transformer-lm-step1.pickle"  # the demo's step
        hide = "; ".join(f"mount --bind {self.work / 'empty'} {d}" for d in HIDDEN)
        (self.work / "empty").mkdir(exist_ok=True)
        job = (f"{hide}; ls /usr/share/openmpi | wc -l; source {self.bundle}/env.sh; "
               f"mpirun --oversubscribe -np 2 oomflight run --run-name relocated -- oomflight replay {trace} "
               f"--device-memory 8GiB --rank-device-memory 1=6GiB --steps 1")
        if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
            self.skipTest("unshare -m is not permitted here (needs root): Open MPI cannot be hidden")
        r = subprocess.run(["unshare", "-m", "bash", "-c", job], cwd=self.work, env=ENV, capture_output=True,
                           text=True, timeout=120)
        out = r.stdout + r.stderr
        self.assertEqual(r.stdout.splitlines()[0], "0", "the system's Open MPI data files must be hidden:\n" + out)
        self.assertNotEqual(r.returncode, 0, out)  # rank 1's out-of-memory error ends the job, as it should
        archive = self.work / "relocated/oomflight/oom.0.h5"
        self.assertTrue(archive.exists(), out)
        with h5py.File(archive, "r") as f:
            self.assertEqual(int(f.attrs["complete"]), 1)
            self.assertEqual(list(f.attrs["origin_ranks"]), [1])
            self.assertEqual(sorted(int(r["rank"]) for r in f["ranks"][...]), [0, 1])

    def test_run_sh_installs_the_extension_alone_with_the_carried_scikit_build_core(self):
        # run.sh's install, as the GPU machine runs it (no MPI or HDF5 there to build liboomflight with: the
        # extension only, scikit-build-core from the folder, no index), with Debian's python3, which has no torch
        # and no scikit-build-core of its own: the package installs without the extension and builds nothing else.
        if not (self.bundle / "python" / "scikit_build_core").is_dir():
            self.skipTest("no real-torch environment to carry scikit-build-core from (scripts/python_envs.sh)")
        line = next(l for l in (SOURCE / "scripts/gpu_check/run.sh").read_text().splitlines()
                    if "OOMFLIGHT_PYTHON_EXTENSION_ONLY=ON" in l)
        self.assertIn("--config-settings=cmake.define.OOMFLIGHT_PYTHON_EXTENSION_ONLY=ON", line)
        site = self.work / "site"
        env = dict(ENV, PYTHONPATH=str(self.bundle / "python"))
        r = subprocess.run(["/usr/bin/python3", "-m", "pip", "install", "-v", "--no-index", "--no-deps",
                            "--no-build-isolation", "--config-settings=cmake.define.OOMFLIGHT_PYTHON_EXTENSION_ONLY=ON",
                            "--target", site, SOURCE / "python"], cwd=self.work, env=env, capture_output=True,
                           text=True, timeout=600)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out[-6000:])
        self.assertIn("not building the torch extension (torch is not importable", out)
        self.assertNotIn("Found MPI", out)
        package = site / "oomflight"
        self.assertTrue((package / "__init__.py").is_file())
        self.assertTrue((package / "_torch_plugin" / "oomflight_torch.cpp").is_file())
        self.assertFalse((package / "lib").exists(), sorted(p.name for p in package.iterdir()))
        self.assertFalse((package / "bin").exists())


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
