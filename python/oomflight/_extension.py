"""Finds, or as a fallback builds, oomflight's torch extension (plugins/pytorch) for the torch of this process.

The extension is built ahead of time by ``pip install --no-build-isolation`` into an environment that holds torch
(CMake driven by scikit-build-core: plugins/pytorch/extension.cmake, with the settings that cmake_settings()
below writes): ``oomflight._torch_ext``, with the torch version it was compiled against. That build is used when
this process runs the same torch. Otherwise (a torch installed or upgraded after oomflight, or a plain isolated
``pip install`` that saw no torch) it is built at first use with
torch.utils.cpp_extension.load (cached in TORCH_EXTENSIONS_DIR, ~/.cache/torch_extensions by default; ranks that
build at once share torch's file lock), which needs a C++ compiler. Either way failures are PluginError with the
reason, which oomflight.torch.install reports once, leaving training untouched.

A build at first use is named (and so cached) by what it is compiled against: torch's version, the Python, and
the include folders (build_name()), so that two environments on one machine never rebuild each other's. In a job,
oomflight.torch asks through load_soon(): the build runs on a thread of its own, never on the job's thread while it
waits in init_process_group or initialises CUDA; ``python -m oomflight.torch --check`` builds it ahead of time.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import sys
import threading
from pathlib import Path

MIN_TORCH = (2, 4)  # the oldest torch the extension is compiled against in CI (docs/pytorch.md)
MODULE = "oomflight._torch_ext"  # the ahead-of-time build's import name


class PluginError(RuntimeError):
    """The torch extension cannot be built or loaded here; the message says why and what to do."""


# Every source of the extension, all of which a build at first use needs (plugins/pytorch/sources.cmake lists the
# same files for the installs that copy them; python.torch_install checks an install holds exactly these).
SOURCES = ("oomflight_torch.cpp", "trace_tracker.hpp", "context_table.hpp", "python_stacks.hpp", "python_thread.hpp",
           "job_store.hpp")


def source_dir() -> Path:
    """The extension's sources: copied into the package when installed (cmake/install.cmake, cmake/wheel.cmake),
    or plugins/pytorch in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_torch_plugin", here.parent.parent / "plugins" / "pytorch"):
        if all((candidate / name).is_file() for name in SOURCES):
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


def cuda_headers(torch_module) -> Path:
    """cuda_include_dir(), or PluginError saying where it looked."""
    cuda_include = cuda_include_dir(torch_module)
    if cuda_include is None:
        raise PluginError("no CUDA headers (cuda_runtime_api.h) in CUDA_HOME or in the nvidia wheels beside torch; "
                          "set CUDA_HOME to the CUDA toolkit torch was built with")
    return cuda_include


LIBRARIES = ["c10_cuda"]  # what both builds link beyond torch's own: the CUDA caching allocator's hooks


def build_arguments(torch_module, src: Path) -> dict:
    """What the build at first use adds to what torch's extension build passes anyway: a C++ extension (no device
    code, so no nvcc) with CUDA's headers, linked against c10_cuda for the allocator's hooks."""
    return {
        "sources": [str(src / "oomflight_torch.cpp")],
        "include_dirs": [str(src), str(cuda_headers(torch_module))],
        "libraries": LIBRARIES,
        "extra_compile_args": ["-O2", "-std=c++17"],
    }


def check_compiler() -> None:
    compiler = os.environ.get("CXX", "c++")
    program = (compiler.split() or ["c++"])[0]  # CXX="ccache g++": the first word is what runs
    if shutil.which(program) is None:
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


def build_name(torch_module, include_dirs: list[str], src: Path | None = None) -> str:
    """The first-use build's module name (and its folder in TORCH_EXTENSIONS_DIR): "oomflight_torch_" and 12 hex
    digits of a hash of what it is compiled against: torch's version, the Python (its version and environment), every
    include folder (torch's own and the build's) and the content of every source in `src` (torch's own check of a
    cached build reads the .cpp only: a changed header would load the old build). Two environments on one machine
    get two builds, and another oomflight its own."""
    from torch.utils import cpp_extension

    digest = hashlib.sha256()
    for part in (torch_module.__version__, sys.version, sys.prefix, *cpp_extension.include_paths(), *include_dirs):
        digest.update(part.encode() + b"\n")
    for name in SOURCES if src is not None else ():
        digest.update((src / name).read_bytes())
    return "oomflight_torch_" + digest.hexdigest()[:12]


_lock = threading.RLock()
_module = None
_how = ""


def load(torch_module, verbose: bool = False):
    """The extension for this torch: the install-time build, else a build now, on this thread (which waits for the
    compiler: a job calls load_soon() instead). Raises PluginError with the reason. Thread-safe (the lock is never
    held while the compiler runs; two builds of one name wait for each other through torch's own file lock)."""
    global _module, _how
    with _lock:
        if _module is not None:
            return _module
        check_torch(torch_module)
        module, why_not = ahead_of_time(torch_module)
        if module is not None:
            _module, _how = module, "built at install time"
            return module
        cached = _import_cached(torch_module)
        if cached is not None:  # built at first use earlier (or by --check): an import, no compiler, no ninja
            _module, _how = cached, f"built at first use earlier, from torch's cache ({why_not})"
            return cached
    check_compiler()
    from torch.utils import cpp_extension

    src = source_dir()
    args = build_arguments(torch_module, src)
    try:
        module = cpp_extension.load(
            name=build_name(torch_module, args["include_dirs"], src),
            sources=args["sources"],
            extra_include_paths=args["include_dirs"],
            extra_cflags=args["extra_compile_args"],
            extra_ldflags=[f"-l{lib}" for lib in args["libraries"]],
            verbose=verbose,
        )
    except Exception as e:  # noqa: BLE001 - a build failure is reported, never raised into training
        raise PluginError(f"building oomflight's torch extension failed: {e}") from e
    with _lock:
        if _module is None:
            _module, _how = module, f"built at first use ({why_not})"
        return _module


def loaded():
    """The extension if it is loaded already, else None. Never builds."""
    return _module


_waiting: list = []  # load_soon's callbacks while the first-use build runs
_builder: threading.Thread | None = None
_build_error = ""  # why the first-use build failed: it is not tried again in this process


def load_soon(torch_module, then, log=None) -> None:
    """Calls ``then(module, error)`` with the extension (error "") or None and the PluginError's message: at once on
    this thread when no build is needed (loaded already, or the install-time build fits this torch), else on a
    thread of its own once the first-use build is done, so that the caller (the job's thread, in init_process_group
    or at CUDA's initialisation) never waits for a compiler. `log(level, message)` says once that a build runs, and
    when it ends. Never raises; exceptions of `then` are its own to handle."""
    global _builder
    module, error = None, ""
    with _lock:
        if _module is not None:
            module = _module
        elif _build_error:
            error = _build_error
        else:
            try:
                check_torch(torch_module)
                aot, _ = ahead_of_time(torch_module)
                if aot is not None or _first_use_build_is_current(torch_module):
                    module = load(torch_module)  # an import (torch checks the cached build), no compiler
            except PluginError as e:
                error = str(e)
            if module is None and not error:
                _waiting.append(then)
                if _builder is None:
                    _builder = threading.Thread(target=_build_in_background, args=(torch_module, log),
                                                name="oomflight-extension-build", daemon=True)
                    _builder.start()
                return
    then(module, error)


def _cached_build(torch_module) -> tuple[str, Path] | None:
    """The name and library of the build at first use of these sources for this torch (its name holds their hash),
    when torch's cache holds it; else None."""
    try:
        from torch.utils import cpp_extension

        src = source_dir()
        name = build_name(torch_module, build_arguments(torch_module, src)["include_dirs"], src)
        library = Path(cpp_extension._get_build_directory(name, verbose=False)) / f"{name}.so"
        return (name, library) if library.is_file() else None
    except Exception:  # noqa: BLE001 - a torch without the helper, a missing source: no cached build
        return None


def _first_use_build_is_current(torch_module) -> bool:
    """Whether the build at first use is in torch's cache: then loading it is an import, done at once, so that a job
    that fails in its first seconds has joined."""
    return _cached_build(torch_module) is not None


def _import_cached(torch_module):
    """The cached build at first use, imported as it is (no compiler, no ninja: a training node may have neither),
    or None."""
    cached = _cached_build(torch_module)
    if cached is None:
        return None
    import importlib.util

    name, library = cached
    try:
        spec = importlib.util.spec_from_file_location(name, library)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except Exception:  # noqa: BLE001 - a broken cache entry: built again
        return None


def _build_in_background(torch_module, log) -> None:
    global _builder, _build_error
    if log is not None:
        log("info", f"building oomflight's torch extension for torch {torch_module.__version__} at first use, on a "
                    "thread of its own (the job goes on meanwhile; its allocator events and coordinated dumps start "
                    "once it is built; `python -m oomflight.torch --check` builds it ahead of time)")
    module, error = None, ""
    try:
        _build_in_a_process()
        module = load(torch_module)  # in torch's cache now: an import
    except PluginError as e:
        error = str(e)
    except Exception as e:  # noqa: BLE001 - reported through the callbacks, never raised
        error = f"building oomflight's torch extension failed: {e}"
    if log is not None and module is not None:
        log("info", f"built oomflight's torch extension at first use: {getattr(module, '__file__', '')}")
    with _lock:
        callbacks = list(_waiting)
        _waiting.clear()
        _builder = None
        _build_error = error
    for then in callbacks:
        try:
            then(module, error)
        except Exception:  # noqa: BLE001 - each callback reports its own failures
            pass


STALE_LOCK_SECONDS = 15 * 60  # a build here takes 20 - 60 s; a lock this old was left by a killed builder


def _clear_stale_lock(torch_module) -> None:
    """Removes torch's lock file of this build when it is older than STALE_LOCK_SECONDS: a builder killed mid-way
    (a job's processes all killed by its scheduler) leaves it, and torch's own load then waits for it for good."""
    try:
        from torch.utils import cpp_extension

        src = source_dir()
        name = build_name(torch_module, build_arguments(torch_module, src)["include_dirs"], src)
        lock = Path(cpp_extension._get_build_directory(name, verbose=False)) / "lock"
        import time

        if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_SECONDS:
            lock.unlink()
            print(f"oomflight: removed {lock}, left by a build that did not finish", flush=True)
    except Exception:  # noqa: BLE001 - torch's own wait then says what it waits for
        pass


def _build_in_a_process() -> None:
    """The build at first use, in a process of its own (this file with --build, in a session of its own, its output
    in a file), waited for here. A job that ends meanwhile cannot cut it short: a compiler killed mid-way would leave
    torch's lock file in the build folder, and every later job's load would wait on it for good. Its log is removed
    once the build succeeds (by the builder, when the job has gone). Raises PluginError with the log's end."""
    import subprocess
    import tempfile

    here = Path(__file__).resolve()
    bootstrap = here.parent / "_bootstrap"  # `oomflight run`'s start-up hook: the builder starts no oomflight
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if p and Path(p).resolve() != bootstrap)
    fd, log_path = tempfile.mkstemp(prefix="oomflight-extension-build-", suffix=".log")
    with os.fdopen(fd, "w") as out:
        builder = subprocess.Popen([sys.executable, str(here), "--build", log_path], env=env,
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    status = builder.wait()
    if status == 0:
        return
    try:
        tail = Path(log_path).read_text(errors="replace")[-3000:].strip()
    except OSError:
        tail = ""
    raise PluginError(f"building oomflight's torch extension failed (the builder exited {status}; its log: "
                      f"{log_path}): {tail}")


def how_loaded() -> str:
    """How load() got the extension: at install time, or at first use and why."""
    return _how


def cmake_settings(torch_module, out: Path) -> None:
    """Writes, as a CMake script, what torch's BuildExtension would pass for a C++ extension named _torch_ext
    (torch/utils/cpp_extension.py: its include and library folders, libraries, the C++ ABI and pybind11's ABI
    defines, of which torch 2.11 has none) plus what build_arguments() adds (CUDA's headers, c10_cuda).
    plugins/pytorch/extension.cmake includes it. Raises PluginError for a torch that cannot have the extension."""
    check_torch(torch_module)
    from torch.utils import cpp_extension

    includes = [*cpp_extension.include_paths(), str(cuda_headers(torch_module))]
    definitions = ["TORCH_EXTENSION_NAME=_torch_ext", "TORCH_API_INCLUDE_EXTENSION_H",
                   f"_GLIBCXX_USE_CXX11_ABI={int(torch_module._C._GLIBCXX_USE_CXX11_ABI)}"]
    for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):  # what makes pybind11 types shareable with torch's
        value = getattr(torch_module._C, f"_PYBIND11_{name}", None)
        if value is not None:
            definitions.append(f'PYBIND11_{name}="{value}"')

    def cmake_list(values) -> str:
        return " ".join(f"[==[{v}]==]" for v in values)

    out.write_text("\n".join([
        f"set(OOMFLIGHT_TORCH_VERSION [==[{base_version(torch_module.__version__)}]==])",
        f"set(OOMFLIGHT_TORCH_INCLUDE_DIRS {cmake_list(includes)})",
        f"set(OOMFLIGHT_TORCH_LIBRARY_DIRS {cmake_list(cpp_extension.library_paths())})",
        f"set(OOMFLIGHT_TORCH_LIBRARIES {cmake_list(['c10', 'torch', 'torch_cpu', 'torch_python', *LIBRARIES])})",
        f"set(OOMFLIGHT_TORCH_DEFINITIONS {cmake_list(definitions)})",
        ""]))


if __name__ == "__main__":
    # Run as a script, never imported through the package, whose oomflight/torch.py would shadow torch here:
    # - by CMake: `python _extension.py --cmake-settings FILE`. Exit 1 with the reason on stderr when there is no
    #   torch to build against; the build then installs the package without the extension.
    # - by _build_in_a_process: `python _extension.py --build LOG`: the build at first use; LOG (its own output) is
    #   removed when it succeeds. Exit 1 with the reason when it fails.
    if len(sys.argv) != 3 or sys.argv[1] not in ("--cmake-settings", "--build"):
        sys.exit("usage: _extension.py --cmake-settings FILE | --build LOG")
    sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    try:
        import torch
    except ImportError as e:
        sys.exit(f"torch is not importable by {sys.executable}: {e}")
    try:
        if sys.argv[1] == "--build":
            _clear_stale_lock(torch)
            print(f"oomflight: building the torch extension at first use: {load(torch).__file__}", flush=True)
            os.unlink(sys.argv[2])
        else:
            cmake_settings(torch, Path(sys.argv[2]))
    except PluginError as e:
        sys.exit(str(e))
