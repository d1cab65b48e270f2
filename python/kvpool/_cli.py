"""The `kvpool` console command of the installed package ([project.scripts]).

It replaces itself (os.execv) with the `kvpool` program that setup.py built
into the package (kvpool/_bin/kvpool, the Makefile's build/kvpool compiled
with the same flags), passing the arguments unchanged: the program keeps
this process's id, so signals sent to it, its exit status and its standard
streams are the program's own, and servers it spawns (/proc/self/exe) are
the same program."""
from __future__ import annotations

import os
import signal
import sys


def program() -> str:
    """The path of the packaged `kvpool` program."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "kvpool")


def main() -> None:
    exe = program()
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"kvpool: {exe} is missing: reinstall the package (pip install .) "
                         "or build it in the tree (make python)\n")
        sys.exit(127)
    # Python ignores SIGPIPE and SIGXFSZ; an ignored signal stays ignored
    # across exec: give the program the defaults a shell would
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    os.execv(exe, ["kvpool", *sys.argv[1:]])


if __name__ == "__main__":
    main()
