"""`oomflight run` makes a plain python3 load the package with no change to the script: the start-up hook runs
(and so does the sitecustomize it shadows), and an OOM reaching the top dumps. The real torch's import hook and
install() under `oomflight run`: test_torch_mpi.py."""
import textwrap
import unittest

from support import CLI, PY, child_env, run, scratch

PROBE = textwrap.dedent("""
    import sys
    import oomflight._autostart as a
    print("started", a.STATE["started"], "shadowed", getattr(sys, "shadowed_sitecustomize_ran", False))
""")


@unittest.skipUnless(CLI, "TEST_CLI names the built oomflight")
class RunInjectsThePackage(unittest.TestCase):
    def env(self, **extra):
        env = child_env(**extra)
        env.pop("OOMFLIGHT_LIBRARY")  # `oomflight run` sets it to its own library
        env["PYTHONPATH"] = extra.get("PYTHONPATH", "")  # nothing of ours: the launcher must add it
        return env

    def test_a_plain_python_loads_the_package_and_the_shadowed_sitecustomize_still_runs(self):
        cwd = scratch()
        (cwd / "job.py").write_text(PROBE)
        site = cwd / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text("import sys\nsys.shadowed_sitecustomize_ran = True\n")
        out = run([CLI, "run", "--", PY, "job.py"], cwd, self.env(PYTHONPATH=str(site)))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "started True shadowed True")
        # --no-python leaves the interpreter alone.
        out = run([CLI, "run", "--no-python", "--", PY, "-c", "import sys; print('oomflight' in sys.modules)"],
                  cwd, self.env())
        self.assertEqual(out.stdout.strip(), "False", out.stderr)

    def test_an_oom_reaching_the_top_of_an_unchanged_script_dumps_and_its_traceback_is_printed(self):
        cwd = scratch()
        (cwd / "train.py").write_text(textwrap.dedent("""
            import oomflight  # the script only initialises (a torch job needs not even that: install() does it)
            oomflight.init(folder="out")
            oomflight.mark_batch(7)
            raise MemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        """))
        out = run([CLI, "run", "--run-name", "inj", "--", PY, "train.py"], cwd, self.env())
        self.assertEqual(out.returncode, 1)
        self.assertIn("MemoryError: CUDA out of memory. Tried to allocate 20.00 GiB", out.stderr)
        self.assertEqual([p.name for p in (cwd / "out").glob("*.h5")], ["oom.7.h5"])


if __name__ == "__main__":
    unittest.main()
