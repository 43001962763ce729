"""The ``kvtier`` console script: runs the ``kvtier`` command (inspect, verify,
gc, clear, bench; docs/cli.md) that the wheel carries as ``kvtier/bin/kvtier``,
in this process's place, with the same arguments."""

from __future__ import annotations

import os
import sys
from pathlib import Path

BINARY = Path(__file__).resolve().parent / "bin" / "kvtier"


def main() -> None:
    if not os.access(BINARY, os.X_OK):
        sys.stderr.write(
            f"kvtier: this install has no kvtier command ({BINARY} is missing or not executable); "
            "install the wheel scripts/build_wheel.sh builds, or build cli/ with CMake (KVTIER_BUILD_CLI)\n"
        )
        sys.exit(127)
    # exec, not a child: signals, the exit status and the terminal (the
    # progress bar) are the command's own.
    os.execv(BINARY, [str(BINARY), *sys.argv[1:]])


if __name__ == "__main__":
    main()
