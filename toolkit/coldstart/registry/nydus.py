"""nydusd as a peer of our lazy mount, for benchmarks only: the same snapshot tree built into a RAFS
image (`nydus-image create`), its data blob and bootstrap pushed to the same registry, and mounted
by `nydusd` (FUSE) fetching chunks from the registry on first read, with its own blob cache,
digest validation and prefetch. The one owner of those two programs' command lines.

Not part of `make setup`: nydus-rs builds for ~25 minutes on 2 cores. `scripts/setup-nydus`
builds it once (`cargo install nydus-rs --locked`) into $COLDSTART_CACHE/nydus/<version>/bin.
Settings chosen to match ours where nydus allows: zstd-compressed chunks (ours are, by default;
``compressor="none"`` against an uncompressed push), 1 MiB chunks (ours), prefetch of the files in
the order the node's access profile first touched them (`--prefetch-policy fs`), all of the rest
after. RAFS v6 (nydus's default format) does not
validate chunk digests on read, so nydusd runs without the check our mount makes on every chunk.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from coldstart.errors import ColdstartError
from coldstart.state import cache_root

VERSION = "2.2.0"


def binary(name: str) -> str:
    exe = cache_root() / "nydus" / VERSION / "bin" / name
    if exe.is_file():
        return str(exe)
    found = shutil.which(name)
    if not found:
        raise ColdstartError(f"{name} not found (scripts/setup-nydus builds nydus-rs {VERSION})")
    return found


@dataclass
class Image:
    bootstrap: Path
    blob: Path
    blob_id: str  # sha256 hex of the data blob: its name in the registry
    bootstrap_digest: str  # sha256:... of the bootstrap, pushed as a blob too


def build(root: Path, out: Path, prefetch_files: list[str], compressor: str = "zstd") -> Image:
    """RAFS v6 image of ``root`` in ``out`` (kept when already built from the same tree, same compressor)."""
    done = out / "image.json"
    if done.exists():
        d = json.loads(done.read_text())
        if d.get("compressor", "none") == compressor:
            return Image(Path(d["bootstrap"]), Path(d["blob"]), d["blob_id"], d["bootstrap_digest"])
    shutil.rmtree(out, ignore_errors=True)
    (out / "blobs").mkdir(parents=True)
    boot = out / "bootstrap"
    argv = [binary("nydus-image"), "create", "-t", "dir-rafs", "--fs-version", "6", "--compressor", compressor,
            "--chunk-size", "0x100000", "--digester", "blake3", "--bootstrap", str(boot),
            "--blob-dir", str(out / "blobs"), "--log-level", "warn", "--prefetch-policy",
            "fs" if prefetch_files else "none", "--output-json", str(out / "create.json"), str(root)]
    # the prefetch list: absolute paths inside the image, one per line, first-needed first
    stdin = "".join(f"/{f}\n" for f in prefetch_files)
    p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise ColdstartError(f"nydus-image create failed: {(p.stderr or p.stdout).strip()[-300:]}")
    blobs = [b for b in (out / "blobs").iterdir() if b.is_file()]
    if len(blobs) != 1:
        raise ColdstartError(f"nydus-image create left {len(blobs)} blobs in {out / 'blobs'}, expected 1")
    digest = "sha256:" + hashlib.sha256(boot.read_bytes()).hexdigest()
    img = Image(boot, blobs[0], blobs[0].name, digest)
    done.write_text(json.dumps({"bootstrap": str(boot), "blob": str(img.blob), "blob_id": img.blob_id,
                                "bootstrap_digest": digest, "compressor": compressor}))
    return img


def push(img: Image, ref: str) -> None:
    """Both blobs to the repository of ``ref`` (nydusd's registry backend reads the data blob by its
    id; the node fetches the bootstrap before mounting)."""
    from coldstart.registry.distribution import Ref, Registry

    reg = Registry(Ref.parse(ref))
    for path, digest in ((img.blob, f"sha256:{img.blob_id}"), (img.bootstrap, img.bootstrap_digest)):
        if not reg.has_blob(digest):
            size = path.stat().st_size
            with open(path, "rb") as f:
                reg.push_blob(iter(lambda: f.read(8 << 20), b""), digest, size)


@dataclass
class NydusMount:
    mountpoint: Path
    proc: subprocess.Popen

    def unmount(self) -> None:
        subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def mount(ref: str, bootstrap_digest: str, mountpoint: Path, work: Path, prefetch: bool = True,
          threads: int = 8, timeout: float = 30.0) -> NydusMount:
    """Fetch the bootstrap from the registry, then mount it with nydusd; returns once the mount
    serves. ``work``: this node's nydus state (bootstrap, blob cache, config, log)."""
    from coldstart.registry.distribution import Ref, Registry

    r = Ref.parse(ref)
    work.mkdir(parents=True, exist_ok=True)
    boot = work / "bootstrap"
    boot.write_bytes(Registry(r).get_blob(bootstrap_digest))
    cfg = {
        "device": {
            "backend": {"type": "registry", "config": {"scheme": r.scheme, "host": r.host, "repo": r.repo,
                                                       "timeout": int(timeout), "connect_timeout": 10,
                                                       "retry_limit": 2}},
            "cache": {"type": "blobcache", "config": {"work_dir": str(work / "cache")}},
        },
        "mode": "direct",
        "digest_validate": False,  # RAFS v6 refuses it ("doesn't support integrity validation yet")
        "iostats_files": False,
        "enable_xattr": False,
        "fs_prefetch": {"enable": prefetch, "threads_count": threads, "merging_size": 1 << 20,
                        "prefetch_all": prefetch},
    }
    (work / "cache").mkdir(exist_ok=True)
    (work / "config.json").write_text(json.dumps(cfg))
    mountpoint.mkdir(parents=True, exist_ok=True)
    log = open(work / "nydusd.log", "ab")
    proc = subprocess.Popen([binary("nydusd"), "--config", str(work / "config.json"), "--mountpoint", str(mountpoint),
                             "--bootstrap", str(boot), "--log-level", "warn", "--fuse-threads", str(threads),
                             "--rlimit-nofile", "0"],  # raising it needs CAP_SYS_RESOURCE
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.ismount(mountpoint):
            return NydusMount(mountpoint, proc)
        if proc.poll() is not None:
            tail = (work / "nydusd.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise ColdstartError(f"nydusd exited with {proc.returncode}: {' | '.join(tail)}")
        time.sleep(0.01)
    proc.kill()
    raise ColdstartError(f"nydusd did not mount {mountpoint} within {timeout:.0f} s (log: {work / 'nydusd.log'})")
