#!/usr/bin/env python3
"""The layering rule of docs/architecture.md, checked on the source tree:
  1. a wing includes only its own headers and those of the wings below it;
  2. an installed header (core/<wing>/include/) includes only installed headers, and never MPI, HDF5, spdlog or fmt;
  3. the analysis and export wings include no MPI or HDF5 header, even privately;
  4. launcher/ and plugins/ include only installed headers of liboomflight (and their own);
  5. the store transport and what it builds on (MPI_FREE) compile without <mpi.h>, directly or through any header
     of the project they include (issue 40: the job's store needs no MPI).
Usage: check_layering.py SOURCE_DIR. Prints every violation with file and line; exits 1 if there is any."""
import pathlib
import re
import sys

BELOW = {
    "base": {"base"},
    "record": {"base", "record"},
    "format": {"base", "record", "format"},
    "control": {"base", "record", "format", "control"},
    "capi": {"base", "record", "format", "control", "capi"},
    "analysis": {"base", "record", "format", "analysis"},
    "export": {"base", "record", "format", "analysis", "export"},
}
# Headers at the top of the include tree, and the wing that owns each.
TOP_LEVEL = {"oomflight/api.h": "base", "oomflight/version.h": "base", "oomflight/oomflight.h": "capi"}
FOREIGN = re.compile(r"^(mpi\.h|hdf5\.h|H5.*\.h|spdlog/.*|fmt/.*)$")
# The store transport and what it builds on: none of these, nor any header of the project they reach, includes mpi.h.
MPI_FREE = ["core/control/src/store_protocol.cpp", "core/control/src/store_handle.cpp",
            "core/control/src/dump_executor.cpp", "core/control/src/agreed_settings.cpp",
            "core/control/src/dump_words.cpp", "core/control/src/dump_role.cpp", "core/control/src/dump_run.cpp", "core/control/src/coordinator.cpp", "core/control/src/peer_processes.cpp",
            "core/control/src/dump_signal.cpp", "core/control/src/retention.cpp"]
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def owner(path):
    """The wing an included "oomflight/..." path belongs to, or None for a plugin's own header."""
    if path in TOP_LEVEL:
        return TOP_LEVEL[path]
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "oomflight" and parts[1] in BELOW else None


def includes(file):
    for number, line in enumerate(file.read_text().splitlines(), 1):
        m = INCLUDE.match(line)
        if m:
            yield number, m.group(1)


def resolve(root, file, inc):
    """The project file an include names (beside the includer, or under a wing's include/ or internal/), or None."""
    beside = file.parent / inc
    if beside.is_file():
        return beside
    for folder in ("include", "internal"):
        for wing in BELOW:
            candidate = root / "core" / wing / folder / inc
            if candidate.is_file():
                return candidate
    return None


def mpi_chain(root, start):
    """The chain of includes by which `start` reaches mpi.h, or None."""
    seen, todo = {start}, [(start, [str(start.relative_to(root))])]
    while todo:
        file, chain = todo.pop()
        for number, inc in includes(file):
            if inc == "mpi.h":
                return chain + [f"line {number}: <mpi.h>"]
            found = resolve(root, file, inc)
            if found is not None and found not in seen:
                seen.add(found)
                todo.append((found, chain + [str(found.relative_to(root))]))
    return None


def main(root):
    root = pathlib.Path(root)
    core = root / "core"
    installed = {str(p.relative_to(core / w / "include")) for w in BELOW for p in (core / w / "include").rglob("*.h*")}
    installed.add("oomflight/version.h")  # generated into the build tree from core/base/version.h.in
    errors = []
    for wing in BELOW:
        for file in sorted((core / wing).rglob("*")):
            if file.suffix not in {".h", ".hpp", ".cpp", ".in"}:
                continue
            public = (core / wing / "include") in file.parents
            for number, inc in includes(file):
                where = f"{file.relative_to(root)}:{number}"
                w = owner(inc)
                if w is not None and w not in BELOW[wing]:
                    errors.append(f"{where}: the {wing} wing includes {inc} from the {w} wing above it")
                if public and FOREIGN.match(inc):
                    errors.append(f"{where}: installed header includes <{inc}>")
                if public and inc.startswith("oomflight/") and inc not in installed:
                    errors.append(f"{where}: installed header includes {inc}, which is not installed")
                if wing in {"analysis", "export"} and re.match(r"^(mpi\.h|hdf5\.h|H5.*\.h)$", inc):
                    errors.append(f"{where}: the {wing} wing must compile without MPI and HDF5 headers ({inc})")
    for folder in ["launcher", "plugins"]:
        for file in sorted((root / folder).rglob("*")):
            if file.suffix not in {".h", ".hpp", ".cpp", ".c"}:
                continue
            for number, inc in includes(file):
                if owner(inc) is not None and inc not in installed:
                    errors.append(f"{file.relative_to(root)}:{number}: includes {inc}, which liboomflight does not install")
    for name in MPI_FREE:
        chain = mpi_chain(root, root / name)
        if chain:
            errors.append(f"{name}: must compile without MPI (the store transport), but includes it: {' -> '.join(chain)}")
    for e in errors:
        print(e)
    print(f"{len(errors)} layering violations in {root}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
