"""Builds and loads oomflight's torch extension (plugins/pytorch) against the torch of this process.

The extension is compiled once per torch version and Python by torch.utils.cpp_extension.load (cached in
TORCH_EXTENSIONS_DIR, ~/.cache/torch_extensions by default; ranks that build at once share torch's file lock).
It needs a C++ compiler and the CUDA headers: when either is missing the error says which, and the caller
(oomflight.torch.install) reports it and leaves training untouched.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

MIN_TORCH = (2, 4)  # the hooks' signatures were checked from 2.4 to 2.11 (docs/pytorch.md)


class PluginError(RuntimeError):
    """The torch extension cannot be built or loaded here; the message says why and what to do."""


def source_dir() -> Path:
    """The extension's sources: copied into the package when installed, or plugins/pytorch in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_torch_plugin", here.parent.parent / "plugins" / "pytorch"):
        if (candidate / "oomflight_torch.cpp").is_file() and (candidate / "trace_tracker.hpp").is_file():
            return candidate
    raise PluginError(f"the torch extension's sources are missing (looked in {here / '_torch_plugin'} and "
                      f"{here.parent.parent / 'plugins' / 'pytorch'}); reinstall oomflight")


def torch_version(torch_module) -> tuple[int, int]:
    parts = torch_module.__version__.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def check_toolchain(torch_module) -> None:
    """Raises PluginError naming what is missing: a torch with the hooks, CUDA, a compiler, the CUDA headers."""
    if torch_version(torch_module) < MIN_TORCH:
        raise PluginError(f"torch {torch_module.__version__} is older than {MIN_TORCH[0]}.{MIN_TORCH[1]}: its "
                          "CUDA caching allocator lacks the trace-tracker hook oomflight needs")
    if not torch_module.cuda.is_available() or torch_module.version.cuda is None:
        raise PluginError(f"torch {torch_module.__version__} has no CUDA here: no caching allocator to watch")
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise PluginError(f"no C++ compiler ('{compiler}' is not on PATH; set CXX) to build oomflight's torch "
                          "extension")
    cuda_home = cpp_extension.CUDA_HOME
    if cuda_home is None or not (Path(cuda_home) / "include" / "cuda_runtime_api.h").is_file():
        raise PluginError(f"no CUDA headers (CUDA_HOME={cuda_home!r} has no include/cuda_runtime_api.h); set "
                          "CUDA_HOME to the CUDA toolkit torch was built with")


_module = None


def load(torch_module, verbose: bool = False):
    """The compiled extension module (built on first use). Raises PluginError with the reason."""
    global _module
    if _module is not None:
        return _module
    check_toolchain(torch_module)
    from torch.utils import cpp_extension

    src = source_dir()
    try:
        _module = cpp_extension.load(
            name="oomflight_torch",
            sources=[str(src / "oomflight_torch.cpp")],
            extra_include_paths=[str(src)],
            extra_cflags=["-O2", "-std=c++17"],
            with_cuda=True,
            verbose=verbose,
        )
    except Exception as e:  # noqa: BLE001 - a build failure is reported, never raised into training
        raise PluginError(f"building oomflight's torch extension failed: {e}") from e
    return _module
