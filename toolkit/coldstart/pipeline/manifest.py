"""manifest.json: what a snapshot is, what made it, and what it needs from the host that restores it.

Written last into the staging directory, which is then renamed into place (publish); read first
at restore. Nothing in it depends on where the snapshot or the model lives on the host: the server
was checkpointed with its run dir at ENGINE_RUN_DIR (a bind mount in a private mount namespace), and
every restore puts its own writable copy of ``run/`` there (pipeline/netns.py).
``validate_against_host`` names every mismatch instead of stopping at the first, so a fallback
message says everything that is wrong at once. File sizes are always checked (free); per-chunk
digests by pipeline/integrity.py.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from coldstart.errors import ColdstartError
from coldstart.fsutil import data_extents
from coldstart.pipeline.integrity import file_digests

SCHEMA_VERSION = 2  # 2: canonical run dir, per-chunk digests, run/ part of the immutable snapshot
MANIFEST_NAME = "manifest.json"
# Where the checkpointed server saw its run dir, and where every restore puts a writable copy of it.
ENGINE_RUN_DIR = "/run/coldstart/engine"
KIND = "coldstart-snapshot"
_CHUNK = 8 << 20


@dataclass
class Canary:
    """What a restored server must answer before it serves (see coldstart.pipeline.canary).

    kind "tokens" (snapshots made before the logprob canary; still restorable): ``max_tokens``
    greedy tokens must equal ``token_ids``. kind "logprobs" (default since): one forward pass with
    ``max_tokens`` = 1: the prompt's token ids and the greedy first token must be equal, and every
    prompt-token and first-token logprob within ``tolerance`` nats of the recorded ones."""
    prompt: str
    token_ids: list[int]
    text: str = ""
    max_tokens: int = 16
    seed: int = 0
    kind: str = "tokens"
    prompt_token_ids: list[int] = field(default_factory=list)
    prompt_logprobs: list[float | None] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    tolerance: float = 0.0


@dataclass
class FileEntry:
    size: int
    xxh3: str = ""  # xxh3_128 hex of the whole file
    chunks: list[str] = field(default_factory=list)  # xxh3_64 hex per integrity.CHUNK bytes
    mode: int = 0o644  # permission bits at publish (the restore gives copies these, whatever the store did)


@dataclass
class Manifest:
    model: str  # what the user passed (a local dir here; HF ids work the same offline)
    model_digest: str  # xxh3_128 over the model dir's (relative path, size, bytes), sorted
    served_model_name: str
    engine_args: list[str]  # the extra vLLM args the user gave (fallback cold boot reuses them)
    host: dict[str, Any]  # hostfacts.HostFacts of the checkpointing host
    canary: Canary
    files: dict[str, FileEntry]  # every file of the snapshot except manifest.json, by relative path
    port: int = 8000
    host_addr: str = "127.0.0.1"
    gated: bool = False  # the server holds clients without the token out until opened (coldstart.engine.gate)
    # the server's control token (coldstart.engine.gate): its dev-mode routes and its closed gate answer
    # only requests that carry it; "" = a server from before the token, whose gate trusts loopback
    control_token: str = ""
    run_dir: str = ENGINE_RUN_DIR  # the engine's run dir as it saw it (a restore mounts run/ there)
    criu_variant: str = "patched"
    device: str = "cpu"  # cpu (our sleep worker) | cuda (vLLM's CuMemAllocator; unverified on GPU)
    asleep: bool = False  # dumped at sleep level 2: the restore must wake + reload the weights
    pids: list[int] = field(default_factory=list)  # the dumped tree, root first
    weights: dict[str, Any] = field(default_factory=dict)  # {"flat": rel, "index": rel, "bytes": n}
    shm_files: list[str] = field(default_factory=list)  # /dev/shm names saved under shm/
    shm_modes: dict[str, int] = field(default_factory=dict)  # their modes (and link-remaps'): CRIU checks them
    log_sizes: dict[str, int] = field(default_factory=dict)  # path under run_dir -> size at dump
    run_files: list[str] = field(default_factory=list)  # files under run_dir the dumped tree holds open
    # capabilities the dumped tree held (CRIU gives them back: a restore must hold them; None = unknown)
    server_caps: list[str] | None = None
    # the worker's x86 xstate permission mask at dump (AMX: stock CRIU drops it; None = unknown)
    xcomp_perm: int | None = None
    # {thread ID in the server's PID namespace: CPU list} of threads bound to fewer than all CPUs at
    # dump (vLLM's worker): CRIU does not restore CPU masks, the restore sets them (pipeline/affinity.py)
    affinity: dict[str, str] = field(default_factory=dict)
    # xxh3_128 of coldstart's own Python sources at checkpoint: the restored worker runs *that* code
    # (it is in the CRIU image), whatever coldstart is installed at restore time ("" = not recorded)
    coldstart_code: str = ""
    # the images' hot layout (pipeline/layout.py): {"child_bytes", "parent_bytes", "recording_restore_s",
    # "early": {child pages file: [[offset, length], ...] touched before the canary}, "early_bytes"};
    # empty: the images as CRIU dumped them
    layout: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    created_at: str = ""
    schema_version: int = SCHEMA_VERSION
    kind: str = KIND

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Manifest":
        if not isinstance(d, dict) or d.get("kind") != KIND:
            raise ColdstartError("manifest.json is not a coldstart snapshot manifest")
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ColdstartError(f"manifest schema version {d.get('schema_version')!r} is not supported "
                                 f"(this coldstart reads version {SCHEMA_VERSION})")
        known = {f.name for f in fields(cls)}
        try:
            kw = {k: v for k, v in d.items() if k in known}
            kw["canary"] = Canary(**kw["canary"])
            kw["files"] = {k: FileEntry(**{**v, "chunks": list(v.get("chunks", []))})
                           for k, v in kw["files"].items()}
            return cls(**kw)
        except (KeyError, TypeError) as e:
            raise ColdstartError(f"manifest.json is incomplete or malformed ({e})") from e


def xxh3_file(path: Path) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def code_digest() -> str:
    """xxh3_128 over the coldstart package's .py files (relative path, content), sorted."""
    import xxhash

    import coldstart

    root = Path(coldstart.__file__).parent
    h = xxhash.xxh3_128()
    for p in sorted(root.rglob("*.py")):
        h.update(f"{p.relative_to(root)}\0".encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def tree_digest(root: Path) -> str:
    """xxh3_128 over every file under ``root`` (relative path, size, content), sorted by path."""
    import xxhash

    h = xxhash.xxh3_128()
    for p in sorted(q for q in Path(root).rglob("*") if q.is_file()):
        rel = str(p.relative_to(root))
        h.update(f"{rel}\0{p.stat().st_size}\0".encode())
        h.update(bytes.fromhex(xxh3_file(p)))
    return h.hexdigest()


def inventory(snapshot_dir: Path, digests: bool = True) -> dict[str, FileEntry]:
    """Size, mode and digests (whole file and per chunk) of every regular file in the snapshot,
    manifest.json excluded. run/ is included: it is the template every restore mounts (read-only
    lower layer) at the engine's run dir, as immutable as the images."""
    out: dict[str, FileEntry] = {}
    for p in sorted(Path(snapshot_dir).rglob("*")):
        if not p.is_file() or p.is_symlink():
            continue
        rel = str(p.relative_to(snapshot_dir))
        if rel == MANIFEST_NAME or rel.endswith(".tmp"):
            continue
        out[rel] = file_entry(p, digests)
    return out


def file_entry(p: Path, digests: bool = True) -> FileEntry:
    """One file's manifest entry: size, mode and (``digests``) its digests."""
    st = p.stat()
    d = file_digests(p) if digests else None
    return FileEntry(size=st.st_size, xxh3=d.xxh3 if d else "", chunks=list(d.chunks) if d else [],
                     mode=st.st_mode & 0o7777)


def write_manifest(snapshot_dir: Path, m: Manifest) -> Path:
    """Atomically write manifest.json (tmp + fsync + rename + dir fsync): its presence publishes."""
    path = Path(snapshot_dir) / MANIFEST_NAME
    tmp = path.with_name(MANIFEST_NAME + ".tmp")
    with open(tmp, "w") as f:
        json.dump(m.to_dict(), f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(snapshot_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read_manifest(snapshot_dir: Path, ref: str | None = None) -> Manifest:
    """``ref``: the registry reference ``snapshot_dir`` is a mount of, named instead of the mount point."""
    path = Path(snapshot_dir) / MANIFEST_NAME
    if not Path(snapshot_dir).is_dir():
        raise ColdstartError(f"snapshot directory {snapshot_dir} does not exist")
    if not path.is_file():
        if ref:
            raise ColdstartError(f"{ref} is not a snapshot: the artifact has no {MANIFEST_NAME} "
                                 "(`coldstart push` of a directory that was not one?)")
        raise ColdstartError(f"{path} is missing: {snapshot_dir} is not a published snapshot "
                             "(an interrupted checkpoint leaves no manifest)")
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ColdstartError(f"{path} is not valid JSON ({e})") from e
    return Manifest.from_dict(d)


def validate_against_host(m: Manifest, snapshot_dir: Path, host=None, verify: bool = False,
                          warnings: list[str] | None = None, remap=None) -> list[str]:
    """Every reason this snapshot cannot be restored on this host, each naming what differs.

    ``host`` is a ``hostfacts.HostFacts`` (collected here when None, with the criu a restore of this
    snapshot would run). File sizes always; the whole
    files' xxh3 when ``verify`` (the restore checks per-chunk digests instead: integrity.py).
    Differences that do not break a restore (another kernel build) go to ``warnings``.
    """
    from coldstart.pipeline import hostfacts

    snapshot_dir = Path(snapshot_dir)
    if host is None:
        from coldstart.criu import server as _criu

        try:
            criu = _criu.find(m.criu_variant)
        except ColdstartError:
            criu = None  # compare() names it
        host = hostfacts.collect(criu)
    problems = hostfacts.compare(m.host, host, warnings=warnings, remap=remap)  # remap: a runtime's paths
    for rel, fe in sorted(m.files.items()):
        p = snapshot_dir / rel
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            problems.append(f"file {rel}: missing")
            continue
        if size != fe.size:
            problems.append(f"file {rel}: size {size}, manifest says {fe.size} (truncated or replaced)")
            continue
        if verify and fe.xxh3 and xxh3_file(p) != fe.xxh3:
            problems.append(f"file {rel}: content digest differs from the manifest (corrupt)")
    if not (snapshot_dir / "run").is_dir():
        problems.append("run/: missing (every restore mounts it at the server's run dir)")
    return problems


def sparse_copy(src: Path, dst: Path, block: int = 1 << 16) -> int:
    """Copy ``src`` to ``dst`` leaving holes where ``src`` has holes or all-zero blocks; keep the mode
    and times (CRIU checks the mode of files it reopens). Returns the bytes written.

    Why: vLLM's /dev/shm message-queue buffers are ~400 MB for even the tiny model, and all but a few
    pages are zeros; copied densely they would cost seconds at every restore."""
    import shutil

    written = 0
    zero = bytes(block)
    with open(src, "rb", buffering=0) as fi, open(dst, "wb", buffering=0) as fo:
        fo.truncate(os.fstat(fi.fileno()).st_size)
        for pos, hole_at in data_extents(fi.fileno()):
            while pos < hole_at:
                n = min(block, hole_at - pos)
                buf = os.pread(fi.fileno(), n, pos)
                if buf != zero[:len(buf)]:
                    os.pwrite(fo.fileno(), buf, pos)
                    written += len(buf)
                pos += n
    shutil.copystat(src, dst)
    return written
