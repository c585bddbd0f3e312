"""The files a restore executes before CRIU runs (pipeline.netns.WRAPPER_TOOLS, criu) and the shared
libraries they load, listed inside the image at build time (``python -m coldstart.containers.helpers``,
docker/Dockerfile) into RESTORE_FILES.

Why: in a cold container restore the wrapper (unshare, sh, the mounts, the copies, the exec of criu)
took a second before CRIU opened its log, all of it reading these few MB from the image's layer behind
the host warmer's reads (results/spot-checks/host-warm-shape). The host reads the list through the
image's layers at the create call and warms them first (containers.run.HostWarm)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from coldstart.pipeline.netns import WRAPPER_TOOLS

RESTORE_FILES = "/opt/coldstart/restore-files"


def shared_libraries(binary: str) -> list[str]:
    """The absolute paths ``ldd`` resolves for ``binary`` (the loader included); [] for a static one."""
    r = subprocess.run(["ldd", binary], capture_output=True, text=True)
    if r.returncode != 0:
        return []
    return [tok for line in r.stdout.splitlines() for tok in line.split() if tok.startswith("/")]


def restore_files() -> list[str]:
    """Real paths of the tools (WRAPPER_TOOLS), criu ($COLDSTART_CRIU or on PATH) and their libraries, each once, in
    the order a restore first needs them."""
    tools = WRAPPER_TOOLS
    bins = [shutil.which(t) for t in tools] + [os.environ.get("COLDSTART_CRIU") or shutil.which("criu")]
    missing = [t for t, b in zip((*tools, "criu"), bins) if not b]
    if missing:
        raise SystemExit(f"restore tools not found in this image: {', '.join(missing)}")
    out: dict[str, None] = {}
    for b in bins:
        for p in (b, *shared_libraries(b)):
            out.setdefault(os.path.realpath(p))
    return list(out)


def main() -> None:
    sys.stdout.write("".join(f"{p}\n" for p in restore_files()))


if __name__ == "__main__":
    main()
