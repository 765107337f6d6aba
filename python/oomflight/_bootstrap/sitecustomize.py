"""Start-up hook for `oomflight run` (which puts this folder first on PYTHONPATH): Python imports it before the
job's script, so `oomflight run -- python train.py` records with no change to train.py.

It first runs the sitecustomize it shadows (a distribution's or a virtual environment's), then starts oomflight
(oomflight._autostart). Nothing here may stop the job: any failure is one line on stderr.
"""
import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


try:
    _run_shadowed_sitecustomize()
except Exception as e:  # noqa: BLE001
    print(f"oomflight: the shadowed sitecustomize failed: {e}", file=sys.stderr)

try:
    import oomflight._autostart

    oomflight._autostart.start()
except Exception as e:  # noqa: BLE001
    print(f"oomflight warn: not watching this Python process: {e}", file=sys.stderr)
