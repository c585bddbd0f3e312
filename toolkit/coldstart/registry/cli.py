"""`coldstart push` / `coldstart pull`: thin typer wrappers over coldstart.registry."""
from __future__ import annotations

import json
from pathlib import Path

import typer

from coldstart.errors import ColdstartError


def _say(msg: str) -> None:
    typer.echo(msg, err=True)


def runtime_ranges_of(tree: Path, snapshot: Path) -> list[tuple[str, int, int]]:
    """The order to publish runtime ``tree`` in for ``snapshot``: the ranges of its files the snapshot's
    server mapped first. Refuses a tree the server did not run from."""
    import os

    from coldstart.pipeline.manifest import read_manifest
    from coldstart.registry.artifact import runtime_ranges

    prefix = read_manifest(Path(snapshot)).host.get("sys_prefix", "")
    if not prefix or os.path.realpath(prefix) != os.path.realpath(tree):
        raise ColdstartError(f"{tree} is not the runtime of {snapshot}: its server ran from {prefix or '(not recorded)'}")
    return runtime_ranges(Path(tree), Path(snapshot))


def push_command(
    tree: Path = typer.Argument(..., help="snapshot directory (or any read-mostly tree, e.g. a venv)"),
    ref: str = typer.Argument(..., help="host[:port]/repo[:tag]; loopback registries use plain HTTP"),
    chunk_kib: int = typer.Option(1024, "--chunk-kib", min=4,
                                  help="chunk size: the unit a lazy read fetches and verifies"),
    pack_mib: int = typer.Option(64, "--pack-mib", min=1, help="pack size: chunks are stored in blobs of about this size"),
    threads: int = typer.Option(4, "--threads", min=1, help="parallel blob uploads"),
    compress: str = typer.Option("zstd", "--compress", help="zstd: store each chunk as a zstd frame where that "
                                 "saves a sixteenth or more (a snapshot's memory images shrink ~4x, so a lazy "
                                 "restore fetches less); none: as is"),
    runtime_of: Path | None = typer.Option(
        None, "--runtime-of", help="TREE is the runtime (the venv with torch and vLLM) that this snapshot's server "
                                   "runs from: its chunks are ordered by what that server maps from TREE (the "
                                   "snapshot's access profile), and `coldstart restore --runtime REF` mounts it "
                                   "lazily where the server expects it"),
    memory_mib: int | None = typer.Option(
        None, "--memory-mib", min=0, help="memory for the frames made while hashing, sent as made (default: a "
                                          "quarter of what is available; 0: none kept, every pack read and "
                                          "compressed again as it is sent)"),
) -> None:
    """Publish TREE as an OCI artifact: an index (file → BLAKE3-addressed chunks) and packs of chunks
    in first-access order (the access profile's). Blobs the registry already has are not sent again.
    The tree is read and compressed once: the frames wait in memory (up to a quarter of what is
    available, or --memory-mib; those over it are made again as they are sent). A snapshot is
    verified against its manifest's digests first: what a mount or a pull of it then serves (every
    chunk checked against the index) is bytes that were verified.
    Credentials, if the registry asks: COLDSTART_REGISTRY_USER / COLDSTART_REGISTRY_PASSWORD."""
    from coldstart.registry.artifact import push, push_runtime

    keep = None if memory_mib is None else memory_mib << 20
    if runtime_of is not None:
        res = push_runtime(tree, ref, runtime_ranges_of(tree, runtime_of), chunk_size=chunk_kib << 10,
                           pack_size=pack_mib << 20, threads=threads, say=_say, compress=compress,
                           keep_bytes=keep)
        _say(f"pushed the runtime {tree} as {res.ref}@{res.manifest_digest[:19]}: {res.uploaded}/{res.blobs} blobs "
             f"uploaded ({res.uploaded_bytes / 2**20:.0f} of {res.total_bytes / 2**20:.0f} MiB) in {res.seconds:.1f} s")
        typer.echo(json.dumps({**res.__dict__}))
        return

    if (tree / "manifest.json").is_file():  # a snapshot: publish only bytes that match its digests
        from coldstart.pipeline import integrity
        from coldstart.pipeline.manifest import read_manifest

        _say(f"verifying {tree} against its manifest before publishing it")
        integrity.verify(tree, read_manifest(tree).files, mode="full")
    res = push(tree, ref, chunk_size=chunk_kib << 10, pack_size=pack_mib << 20, threads=threads, say=_say,
               compress=compress, keep_bytes=keep)
    _say(f"pushed {res.ref}@{res.manifest_digest[:19]}: {res.uploaded}/{res.blobs} blobs uploaded "
         f"({res.uploaded_bytes / 2**20:.0f} of {res.total_bytes / 2**20:.0f} MiB) in {res.seconds:.1f} s")
    typer.echo(json.dumps({**res.__dict__}))


def pull_command(
    ref: str = typer.Argument(..., help="host[:port]/repo[:tag][@sha256:...]"),
    dest: Path = typer.Argument(..., help="directory to create (must not exist); with --pack, the image file"),
    threads: int = typer.Option(4, "--threads", min=1, help="parallel pack downloads"),
    pack: bool = typer.Option(False, "--pack", help="keep the snapshot as a compressed read-only image at DEST "
                                                    "(as `coldstart snapshot pack` writes; `coldstart restore DEST` "
                                                    "mounts it), not as a directory"),
    compressor: str = typer.Option("lz4hc", "--compressor", help="with --pack: lz4hc (fastest restore) | zstd "
                                                                 "(smallest; a slower cold restore) | lz4"),
) -> None:
    """Download REF into DEST: every chunk checked against its BLAKE3 digest and every pack against its
    sha256; DEST appears only once all of it is verified and on disk. A snapshot is then checked
    against its manifest's digests too, and this node records it (its first restore skips the check).
    With --pack the snapshot is packed into the image DEST and the pulled directory removed; the image
    is mounted under the node dir and checked there."""
    if pack:
        from coldstart.pipeline.nodeimage import pull_image

        res = pull_image(ref, dest, compressor=compressor, threads=threads, say=_say)
        _say(f"{dest}: {res['image_bytes'] / 2**20:.0f} MiB for {res['bytes'] / 2**20:.0f} MiB pulled"
             + (f", checked and mounted at {res['mounted_at']}" if res["checked"] else ""))
        typer.echo(json.dumps(res))
        return
    from coldstart.registry.artifact import pull

    res = pull(ref, dest, threads=threads, say=_say)
    if (res.dir / "manifest.json").is_file():
        # a snapshot: check it against its own manifest now, while it is in the page cache, so that this
        # node's record lets its first restore skip the full check (integrity.py)
        from coldstart.pipeline import integrity
        from coldstart.pipeline.manifest import read_manifest

        try:
            integrity.verify(res.dir, read_manifest(res.dir).files, mode="full")
        except BaseException as e:  # damaged (a push that skipped that check), another manifest version, a file
            import shutil           # it names but the artifact lacks: not kept, so a retry finds DEST free

            shutil.rmtree(res.dir, ignore_errors=True)
            if isinstance(e, OSError):
                raise ColdstartError(f"{ref}: the pulled snapshot does not match its manifest "
                                     f"({e.strerror or e}: {e.filename}); {dest} removed") from None
            raise
    typer.echo(json.dumps({**res.__dict__, "dir": str(res.dir)}))


def mount_command(
    ref: str = typer.Argument(..., help="host[:port]/repo[:tag][@sha256:...]"),
    mountpoint: Path = typer.Argument(..., help="directory to mount on (created if missing)"),
    prefetch: str = typer.Option("all", "--prefetch",
                                 help="all: fetch every chunk in first-access order from the start (reads that miss "
                                      "go first); profiled: only the chunks the access profile names; none"),
    threads: int = typer.Option(8, "--threads", min=1, max=256, help="the daemon's fetch workers"),
    timeout_s: float = typer.Option(30.0, "--timeout-s", min=1.0,
                                    help="per registry request; a read past it fails with EIO"),
    cache_max_mib: int | None = typer.Option(
        None, "--cache-max-mib", min=0, help="bound on the node's chunk cache: least recently used chunks that no live "
                                      "mount uses are evicted (default: COLDSTART_LAZY_CACHE_MAX_BYTES, else none)"),
) -> None:
    """Serve REF read-only at MOUNTPOINT, lazily: chunks fetched on first read, each verified (BLAKE3)
    before any byte of it is returned, kept in the node's chunk cache (COLDSTART_LAZY_CACHE) shared
    by every mount. Returns once the mount serves; the daemon runs until `coldstart umount`."""
    from coldstart.registry.mount import mount

    m = mount(ref, mountpoint, prefetch=prefetch, threads=threads, timeout_s=timeout_s,
              cache_max_bytes=None if cache_max_mib is None else cache_max_mib << 20)
    typer.echo(json.dumps({"mountpoint": str(m.mountpoint), "pid": m.pid, "manifest_digest": m.manifest_digest,
                           "log": str(m.log)}))


def umount_command(mountpoint: Path = typer.Argument(..., help="a mount made by `coldstart mount`")) -> None:
    """Unmount; the daemon exits. A process still mapping its files takes SIGBUS on its next miss."""
    from coldstart.registry.mount import unmount_point

    unmount_point(mountpoint)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    app.command("push")(push_command)
    app.command("pull")(pull_command)
    app.command("mount")(mount_command)
    app.command("umount")(umount_command)
