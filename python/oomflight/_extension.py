"""Finds, or as a fallback builds, oomflight's torch extension (plugins/pytorch) for the torch of this process.

The extension is built ahead of time by ``pip install --no-build-isolation`` into an environment that holds torch
(setup.py, with torch's own BuildExtension): ``oomflight._torch_ext``, with the torch version it was compiled
against. That build is used when this process runs the same torch. Otherwise (a torch installed or upgraded after
oomflight, or a plain isolated ``pip install`` that saw no torch) it is built at first use with
torch.utils.cpp_extension.load (cached in TORCH_EXTENSIONS_DIR, ~/.cache/torch_extensions by default; ranks that
build at once share torch's file lock), which needs a C++ compiler. Either way failures are PluginError with the
reason, which oomflight.torch.install reports once, leaving training untouched.
"""
from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path

MIN_TORCH = (2, 4)  # the oldest torch the extension is compiled against in CI (docs/pytorch.md)
MODULE = "oomflight._torch_ext"  # the ahead-of-time build's import name


class PluginError(RuntimeError):
    """The torch extension cannot be built or loaded here; the message says why and what to do."""


def source_dir() -> Path:
    """The extension's sources: copied into the package when installed, or plugins/pytorch in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_torch_plugin", here.parent.parent / "plugins" / "pytorch"):
        if all((candidate / name).is_file() for name in ("oomflight_torch.cpp", "trace_tracker.hpp",
                                                          "context_table.hpp")):
            return candidate
    raise PluginError(f"the torch extension's sources are missing (looked in {here / '_torch_plugin'} and "
                      f"{here.parent.parent / 'plugins' / 'pytorch'}); reinstall oomflight")


def torch_version(torch_module) -> tuple[int, int]:
    parts = torch_module.__version__.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def base_version(version: str) -> str:
    """"2.11.0+cu130" -> "2.11.0": the extension's ABI follows torch's release, not its CUDA flavour."""
    return version.split("+")[0]


def check_torch(torch_module) -> None:
    """Raises PluginError for a torch without the hooks."""
    if torch_version(torch_module) < MIN_TORCH:
        raise PluginError(f"torch {torch_module.__version__} is older than {MIN_TORCH[0]}.{MIN_TORCH[1]}: its "
                          "CUDA caching allocator lacks the trace-tracker hook oomflight needs")
    if torch_module.version.cuda is None:
        raise PluginError(f"torch {torch_module.__version__} is a build without CUDA: no caching allocator to watch")


def cuda_include_dir(torch_module) -> Path | None:
    """CUDA's headers for the build (c10/cuda includes cuda_runtime_api.h): CUDA_HOME's, else the ones the CUDA
    wheels torch depends on ship (nvidia/cu13/include, nvidia/cuda_runtime/include), so that no toolkit is needed."""
    from torch.utils import cpp_extension

    candidates = []
    if cpp_extension.CUDA_HOME:
        candidates.append(Path(cpp_extension.CUDA_HOME) / "include")
    site = Path(torch_module.__file__).resolve().parent.parent
    candidates += [site / "nvidia" / "cu13" / "include", site / "nvidia" / "cuda_runtime" / "include"]
    for candidate in candidates:
        if (candidate / "cuda_runtime_api.h").is_file():
            return candidate
    return None


def build_arguments(torch_module, src: Path) -> dict:
    """What both builds (setup.py's and the fallback's) pass to torch's extension build: a C++ extension (no
    device code, so no nvcc) with CUDA's headers, linked against c10_cuda for the allocator's hooks."""
    cuda_include = cuda_include_dir(torch_module)
    if cuda_include is None:
        raise PluginError("no CUDA headers (cuda_runtime_api.h) in CUDA_HOME or in the nvidia wheels beside torch; "
                          "set CUDA_HOME to the CUDA toolkit torch was built with")
    return {
        "sources": [str(src / "oomflight_torch.cpp")],
        "include_dirs": [str(src), str(cuda_include)],
        "libraries": ["c10_cuda"],
        "extra_compile_args": ["-O2", "-std=c++17"],
    }


def check_compiler() -> None:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise PluginError(f"no C++ compiler ('{compiler}' is not on PATH; set CXX) to build oomflight's torch "
                          "extension, and no build made for this torch at install time (reinstall with "
                          "`pip install --no-build-isolation` into this environment)")


def ahead_of_time(torch_module):
    """The extension built at install time, if it was built against this process's torch; else None and why."""
    try:
        module = importlib.import_module(MODULE)
    except ImportError as e:
        return None, f"no build made at install time ({e})"
    built = module.build_info().get("torch_version", "")
    if built != base_version(torch_module.__version__):
        return None, f"the build made at install time is for torch {built}, this process runs {torch_module.__version__}"
    return module, ""


_module = None
_how = ""


def load(torch_module, verbose: bool = False):
    """The extension for this torch: the install-time build, else a build now. Raises PluginError with the
    reason."""
    global _module, _how
    if _module is not None:
        return _module
    check_torch(torch_module)
    module, why_not = ahead_of_time(torch_module)
    if module is not None:
        _module, _how = module, "built at install time"
        return module
    check_compiler()
    from torch.utils import cpp_extension

    src = source_dir()
    args = build_arguments(torch_module, src)
    try:
        _module = cpp_extension.load(
            name="oomflight_torch",
            sources=args["sources"],
            extra_include_paths=args["include_dirs"],
            extra_cflags=args["extra_compile_args"],
            extra_ldflags=[f"-l{lib}" for lib in args["libraries"]],
            verbose=verbose,
        )
    except Exception as e:  # noqa: BLE001 - a build failure is reported, never raised into training
        raise PluginError(f"building oomflight's torch extension failed: {e}") from e
    _how = f"built at first use ({why_not})"
    return _module


def how_loaded() -> str:
    """How load() got the extension: at install time, or at first use and why."""
    return _how
