"""What experiments/docker_start_reads.py and restore_phase_reads.py share: the kernel's page-cache
insertions traced through tracefs (filemap:mm_filemap_add_to_page_cache, CLOCK_MONOTONIC), and the
traced inodes named by walking the host's system directories, our dockerd's data root (the image's
layers, shown as "layer:...") and the benchmark's snapshots. A module, not a script."""
import os
import re
from pathlib import Path

TRACE = Path("/sys/kernel/tracing")
EVENT = TRACE / "events/filemap/mm_filemap_add_to_page_cache/enable"
ROOTS = ["/usr", "/etc", "/var/lib/coldstart-docker", "/opt", "/root/.cache", "/var/tmp/coldstart-bench-container"]
LAYERS = "/var/lib/coldstart-docker/root/overlay2/"
SNAPSHOTS = "/var/tmp/coldstart-bench-container/"


def setup(buffer_kb: int) -> None:
    """tracefs mounted, its clock CLOCK_MONOTONIC (time.monotonic's), a buffer of ``buffer_kb`` per CPU."""
    if not EVENT.exists():
        os.system(f"mount -t tracefs nodev {TRACE}")
    (TRACE / "trace_clock").write_text("mono")
    (TRACE / "buffer_size_kb").write_text(str(buffer_kb))


def inode_names(want: set[int]) -> dict[int, str]:
    """A path for each inode of ``want`` found under ROOTS (the first seen; layer files as "layer:...")."""
    names: dict[int, str] = {}
    for root in ROOTS:
        for d, _, files in os.walk(root):
            for n in files:
                p = os.path.join(d, n)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                if st.st_ino in want and st.st_ino not in names:
                    names[st.st_ino] = p.replace(LAYERS, "layer:")
            if len(names) == len(want):
                break
    return names


def kind(path: str, unnamed: str = "?") -> str:
    """The kind of file an inode_names path is; ``unnamed`` for "?" (an inode found nowhere: metadata)."""
    if path.startswith("layer:"):
        return "image layers"
    if path.startswith(SNAPSHOTS):
        return "snapshot"
    if re.search(r"/(dockerd|containerd|containerd-shim[^/]*|runc|crun|docker-proxy|docker-init)$", path):
        return "docker's binaries"
    return "host: other" if path != "?" else unnamed
