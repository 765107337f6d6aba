"""Builds oomflight's Python package. Everything static is in pyproject.toml; this file does two things:

1. Copies the torch extension's sources (../plugins/pytorch) into the package (oomflight/_torch_plugin, ignored by
   git), so that an installed oomflight can still build its extension at first use for a torch it did not see.
2. When torch is importable here, which is the case with ``pip install --no-build-isolation`` into an environment
   that holds torch (the convention of torch extensions: the build must see the torch it will run with), builds
   the extension ahead of time with torch's own BuildExtension as ``oomflight._torch_ext``, so that training nodes
   need no compiler. An isolated build (plain ``pip install ./python``) sees no torch and installs the package
   alone.
"""
import shutil
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
PLUGIN = HERE.parent / "plugins" / "pytorch"
SOURCES = ("oomflight_torch.cpp", "trace_tracker.hpp", "context_table.hpp")
TARGET = HERE / "oomflight" / "_torch_plugin"


def copy_plugin_sources() -> None:
    if all((PLUGIN / name).is_file() for name in SOURCES):
        TARGET.mkdir(exist_ok=True)
        (TARGET / "__init__.py").write_text('"""The torch extension\'s sources (copied from plugins/pytorch)."""\n')
        for name in SOURCES:
            shutil.copy2(PLUGIN / name, TARGET / name)
    elif not all((TARGET / name).is_file() for name in SOURCES):  # an sdist carries the copies already
        raise SystemExit(f"setup.py: {PLUGIN} is missing; build from an oomflight checkout")


def torch_extension() -> dict:
    """setup() arguments for the ahead-of-time build, or none when this build cannot see torch."""
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("setup.py: torch is not importable in this build (an isolated build, or no torch here): installing "
              "the package without its torch extension, which is then built at first use", file=sys.stderr)
        return {}
    sys.path.insert(0, str(HERE))
    from oomflight import _extension  # the build arguments, shared with the first-use build

    try:
        _extension.check_torch(torch)  # a CPU-only torch has no caching allocator: nothing to build for
        args = _extension.build_arguments(torch, TARGET)
    except _extension.PluginError as e:
        print(f"setup.py: not building the torch extension: {e}", file=sys.stderr)
        return {}
    # Relative paths: setuptools refuses absolute source paths in an sdist-like build.
    sources = [str(Path(s).relative_to(HERE)) for s in args["sources"]]
    extension = CppExtension(_extension.MODULE, sources, include_dirs=args["include_dirs"],
                             libraries=args["libraries"], extra_compile_args=args["extra_compile_args"])
    print(f"setup.py: building {_extension.MODULE} against torch {torch.__version__}", file=sys.stderr)
    return {"ext_modules": [extension], "cmdclass": {"build_ext": BuildExtension.with_options(use_ninja=False)}}


copy_plugin_sources()
setup(**torch_extension())
