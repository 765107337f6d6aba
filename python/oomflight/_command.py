"""The `oomflight` command of a pip install: the console script pip puts on the environment's PATH runs main(),
which replaces this Python process with the package's own executable, oomflight/bin/oomflight (cmake/wheel.cmake),
so that the command's exit status, signals and process id are the executable's own (mpirun and srun see the
process they started). This is how the `cmake` and `ninja` packages on PyPI ship their commands: a wheel cannot put
a compiled executable on PATH itself."""
from __future__ import annotations

import os
import sys
from pathlib import Path


def executable() -> Path:
    """The package's own `oomflight` executable (it may be absent: a package copied without its build)."""
    return Path(__file__).resolve().parent / "bin" / "oomflight"


def main() -> None:
    exe = executable()
    if not os.access(exe, os.X_OK):
        sys.exit(f"oomflight: this Python package has no command ({exe} is missing): it was not installed with "
                 "pip, which builds it (`pip install ./python` from an oomflight checkout)")
    os.execv(exe, [str(exe), *sys.argv[1:]])


if __name__ == "__main__":
    main()
