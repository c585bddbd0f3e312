"""A snapshot kept on the node as one compressed, read-only EROFS image, restored from a read-only
mount of it. The kernel decompresses on page-in, so the restore is unchanged (it already takes
read-only snapshots). With lz4hc the node's disk holds a quarter of the tiny model's snapshot but
two thirds of the bench model's, whose random bf16 weights lz4 cannot compress; zstd takes a fifth
off those too (results/spot-checks/node-erofs*). The one owner of mkfs.erofs's and the EROFS
mount's command lines."""
from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import time
from pathlib import Path

from coldstart.errors import ColdstartError
from coldstart.fsutil import fsync_dir, fsync_file, identity, remove_dead_stages
from coldstart.pipeline.manifest import MANIFEST_NAME, read_manifest
from coldstart.state import cache_root, node_dir

# lz4hc decompresses fastest (a cold tiny restore was no slower than from the plain directory);
# zstd (level 3: mkfs.erofs's own default level compressed the bench model's weights less than
# lz4hc) needs mkfs.erofs >= 1.8, which make setup builds (scripts/setup.d/70-erofs-utils.sh).
COMPRESSOR = "lz4hc"
COMPRESSORS = {"lz4hc": "lz4hc", "lz4": "lz4", "zstd": "zstd,level=3"}
CLUSTER = 64 << 10  # the physical cluster: a page fault decompresses at most this much
EROFS_MAGIC, MAGIC_AT = 0xE0F5E1E2, 1024  # the superblock's magic, little-endian, at byte 1024


def mkfs_erofs() -> str:
    """make setup's mkfs.erofs 1.8 (it writes zstd) where there is one, else the system's."""
    built = cache_root() / "erofs-utils/current/bin/mkfs.erofs"
    return str(built) if os.access(built, os.X_OK) else "mkfs.erofs"


def _mkfs_for(compressor: str) -> str:
    """The mkfs.erofs that writes ``compressor``; one clear line where none here does."""
    if compressor not in COMPRESSORS:
        raise ColdstartError(f"unknown compressor {compressor!r}: choose one of {', '.join(COMPRESSORS)}")
    mkfs = mkfs_erofs()
    if compressor == "zstd" and mkfs == "mkfs.erofs":
        raise ColdstartError("zstd needs mkfs.erofs >= 1.8, which make setup builds; "
                             "Debian 12's erofs-utils 1.5 writes lz4hc and lz4 only")
    return mkfs


def allocated_bytes(root: Path) -> int:
    """What the files under ``root`` take on its disk (their blocks: holes not counted)."""
    return sum(os.lstat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(root) for f in fs)


def _run(argv: list[str], what: str) -> None:
    try:
        p = subprocess.run(argv, capture_output=True, text=True)
    except FileNotFoundError:
        raise ColdstartError(f"{argv[0]} not found: {what} needs it (make setup, or apt-get install erofs-utils)") from None
    if p.returncode != 0:
        lines = (p.stderr or p.stdout).strip().splitlines()
        errors = [ln for ln in lines if ln.startswith("<E>")] or lines  # mkfs.erofs ends with a --help hint
        raise ColdstartError(f"{what} failed ({os.path.basename(argv[0])} exit {p.returncode}): "
                             f"{errors[-1] if errors else 'no output'}")


def pack(snapshot: Path, image: Path, *, compressor: str = COMPRESSOR, cluster: int = CLUSTER) -> dict:
    """Write ``snapshot`` into the EROFS image ``image`` (staged beside it, fsynced, renamed: a
    killed pack leaves no image). Returns its bytes, the snapshot's and the seconds it took."""
    snapshot, image = Path(snapshot), Path(image)
    mkfs = _mkfs_for(compressor)
    read_manifest(snapshot)  # one clear line for a missing, partial or damaged snapshot
    if image.exists():
        raise ColdstartError(f"{image} exists: remove it or choose another path")
    image.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_stages(image.parent, image.name)  # a killed pack's
    tmp = image.with_name(f".{image.name}.partial-{os.getpid()}")
    t0 = time.monotonic()
    try:
        _run([mkfs, f"-z{COMPRESSORS[compressor]}", f"-C{cluster}", "--quiet", "--all-root",
              str(tmp), str(snapshot)], f"packing {snapshot} ({compressor})")
        fsync_file(tmp)
        os.rename(tmp, image)
        fsync_dir(image.parent)
    finally:
        tmp.unlink(missing_ok=True)
    return {"bytes": image.stat().st_size, "snapshot_bytes": allocated_bytes(snapshot),
            "seconds": round(time.monotonic() - t0, 1)}


def mount(image: Path, at: Path) -> Path:
    """Mount ``image`` read-only at ``at`` (made if missing); returns the snapshot's path there."""
    image, at = Path(image), Path(at)
    if not image.is_file():
        raise ColdstartError(f"{image}: no such image")
    at.mkdir(parents=True, exist_ok=True)
    if os.path.ismount(at):
        raise ColdstartError(f"{at} is already a mount point")
    _run(["mount", "-t", "erofs", "-o", "ro,loop", str(image), str(at)], f"mounting {image}")
    if not (at / MANIFEST_NAME).is_file():
        unmount(at)
        raise ColdstartError(f"{image} holds no snapshot ({MANIFEST_NAME} missing at its root)")
    return at


def unmount(at: Path) -> Path:
    """Unmount a mounted image: its mount point, or the image itself where `coldstart restore IMAGE`
    mounted it (under the node dir: the user never saw that path); refused while a restore maps its
    files (the kernel says busy). Returns the mount point it unmounted."""
    at = Path(at)
    if at.is_file() and is_image(at):
        image, at = at, node_mount_point(at)
        if not os.path.ismount(at):
            raise ColdstartError(f"{image} is not mounted under the node dir ({at}); give the directory "
                                 "`snapshot mount` mounted it at")
    if not os.path.ismount(at):
        raise ColdstartError(f"{at} is not a mount point")
    _run(["umount", str(at)], f"unmounting {at}")
    return at


def is_image(path: Path) -> bool:
    """Whether ``path`` is an EROFS image (its superblock's magic), e.g. one `snapshot pack` wrote."""
    try:
        with open(path, "rb") as f:
            f.seek(MAGIC_AT)
            return int.from_bytes(f.read(4), "little") == EROFS_MAGIC
    except OSError:
        return False


def node_mount_point(image: Path) -> Path:
    """Where `coldstart restore IMAGE` mounts ``image`` on this node: one directory per image, keyed
    by its path and identity (a new image at the same path gets its own)."""
    key = hashlib.sha256(repr((os.path.realpath(image), *identity(os.stat(image)))).encode()).hexdigest()[:16]
    return node_dir() / "images" / key


def mounted(image: Path) -> Path:
    """Where ``image`` is mounted read-only on this node, mounting it first if it is not: one mount
    point per image (by its path and identity) under the node dir, shared by every restore of it
    and left mounted after them (a restored server maps its files). What `coldstart restore IMAGE`
    restores from."""
    image = Path(image)
    if not is_image(image):
        raise ColdstartError(f"{image} is a file but not an image written by `coldstart snapshot pack` "
                             "(a snapshot is a directory)")
    at = node_mount_point(image)
    root = at.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:  # two restores of one image at once mount it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        return at if os.path.ismount(at) else mount(image, at)


def pull_image(ref: str, image: Path, *, compressor: str = COMPRESSOR, threads: int = 4,
               say=lambda s: None) -> dict:
    """`coldstart pull --pack`: a snapshot from a registry kept on this node as an image, never as a
    directory. It is pulled into a staging directory beside ``image`` (every chunk checked), packed,
    and the directory removed, so the disk holds both only while packing. The image is then mounted
    under the node dir, as `coldstart restore IMAGE` would, and its files checked there against the
    snapshot's manifest; the node records that check, so the image's first restore hashes nothing.
    Where the image cannot be mounted here (no right to mount), that check is the first restore's."""
    import shutil

    from coldstart.pipeline import integrity
    from coldstart.registry.artifact import pull

    image = Path(image)
    _mkfs_for(compressor)  # before a download it could not pack
    if image.exists():
        raise ColdstartError(f"{image} exists: remove it or choose another path")
    image.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_stages(image.parent, image.name)  # a killed pull's or pack's
    work = image.parent / f".{image.name}.pull-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        res = pull(ref, work, threads=threads, say=say)
        say(f"packing into {image} ({compressor})")
        st = pack(work, image, compressor=compressor)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {"image": str(image), "manifest_digest": res.manifest_digest, "files": res.files, "bytes": res.bytes,
           "image_bytes": st["bytes"], "pull_seconds": res.seconds, "pack_seconds": st["seconds"], "checked": False}
    try:
        at = mounted(image)
    except ColdstartError as e:
        say(f"not checked on this node ({e}): the image's first restore checks every file")
        return out
    try:
        integrity.verify(at, read_manifest(at).files, mode="full")
    except integrity.IntegrityError:
        try:
            unmount(at)
        except ColdstartError:
            pass
        image.unlink(missing_ok=True)
        raise
    return {**out, "mounted_at": str(at), "checked": True}
