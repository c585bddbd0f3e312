"""The `coldstart` command. `coldstart restore`, the container entrypoint, goes straight to its own
light parser (pipeline.entry) so that nothing but the restore is imported before it starts; every
other command goes to the typer CLI (coldstart.cli)."""
from __future__ import annotations

import sys
import time

STARTED = time.time()  # the entrypoint's first line of ours: the runtime's start and the interpreter's are before it


def main() -> int | None:
    if len(sys.argv) > 1 and sys.argv[1] == "restore":
        from coldstart.pipeline.entry import main as restore_main

        return restore_main(sys.argv[2:])
    from coldstart.cli import main as cli_main

    return cli_main()
