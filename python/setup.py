"""Copies the torch extension's sources (../plugins/pytorch) into the package (oomflight/_torch_plugin, ignored
by git), so that an installed oomflight can build its extension against the user's torch at first use. It runs
before any setuptools command: metadata generation already lists the package. Everything else is in
pyproject.toml."""
import shutil
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
PLUGIN = HERE.parent / "plugins" / "pytorch"
SOURCES = ("oomflight_torch.cpp", "trace_tracker.hpp")


def copy_plugin_sources() -> None:
    target = HERE / "oomflight" / "_torch_plugin"
    if all((PLUGIN / name).is_file() for name in SOURCES):
        target.mkdir(exist_ok=True)
        (target / "__init__.py").write_text('"""The torch extension\'s sources (copied from plugins/pytorch)."""\n')
        for name in SOURCES:
            shutil.copy2(PLUGIN / name, target / name)
    elif not all((target / name).is_file() for name in SOURCES):  # an sdist carries the copies already
        raise SystemExit(f"setup.py: {PLUGIN} is missing; build from an oomflight checkout")


copy_plugin_sources()
setup()
