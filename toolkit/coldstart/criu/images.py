"""Facts about a CRIU image directory, read without CRIU (no `crit` needed).

CRIU images are ``magic(s)`` followed by ``u32 length + protobuf message`` entries. pstree.img
holds one ``PstreeEntry`` per process (field 1 = pid, field 2 = ppid), so counting entries and
reading two varints is enough; pages-*.img is raw page data whose size is what a restore reads
(stock) or maps (mmap restore).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from coldstart.errors import ColdstartError

IMG_COMMON_MAGIC = 0x54564319
IMG_SERVICE_MAGIC = 0x55105940


@dataclass(frozen=True)
class ImageFacts:
    images_dir: Path
    pages_bytes: int  # total size of pages-*.img
    pages_files: int
    total_bytes: int  # every file in the directory
    n_processes: int
    pids: list[int] = field(default_factory=list)
    root_pid: int | None = None

    @property
    def pages_gib(self) -> float:
        return self.pages_bytes / 2**30


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            return v, i
        shift += 7


def fields(msg: bytes) -> dict[int, list]:
    """Every field of a protobuf message by number, in order: varints as ints, the other wire types
    as their bytes."""
    out: dict[int, list] = {}
    i = 0
    while i < len(msg):
        key, i = _varint(msg, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(msg, i)
        elif wt == 2:
            n, i = _varint(msg, i)
            v, i = msg[i:i + n], i + n
        elif wt in (1, 5):
            n = 8 if wt == 1 else 4
            v, i = msg[i:i + n], i + n
        else:
            raise ValueError(f"unexpected wire type {wt}")
        if i > len(msg):
            raise ValueError("field runs past the end of the entry")
        out.setdefault(num, []).append(v)
    return out


def _ints(msg: bytes) -> dict[int, int]:
    """The varint fields of a protobuf message (last value wins); other wire types are skipped."""
    return {num: [v for v in vs if isinstance(v, int)][-1] for num, vs in fields(msg).items()
            if any(isinstance(v, int) for v in vs)}


def _pid_ppid(msg: bytes) -> tuple[int | None, int | None]:
    f = _ints(msg)
    return f.get(1), f.get(2)


def _entries(path: Path) -> list[bytes]:
    """The length-prefixed protobuf entries of a CRIU image file (after its magic)."""
    return [msg for _, msg in _entries_at(path)]


def _entries_at(path: Path) -> list[tuple[int, bytes]]:
    """(byte offset, entry) of every length-prefixed protobuf entry of a CRIU image file."""
    data = path.read_bytes()
    if len(data) < 8:
        raise ColdstartError(f"{path}: too short to be a CRIU image ({len(data)} bytes)")
    (m0,) = struct.unpack_from("<I", data, 0)
    i = 8 if m0 in (IMG_COMMON_MAGIC, IMG_SERVICE_MAGIC) else 4
    out: list[tuple[int, bytes]] = []
    while i < len(data):
        if i + 4 > len(data):
            raise ColdstartError(f"{path}: truncated entry header at byte {i}")
        (n,) = struct.unpack_from("<I", data, i)
        i += 4
        if i + n > len(data):
            raise ColdstartError(f"{path}: truncated entry at byte {i} (wants {n} bytes)")
        out.append((i, data[i : i + n]))
        i += n
    return out


PE_PARENT, PE_LAZY, PE_PRESENT = 1, 2, 4


def pagemap_flags(e: dict[int, int]) -> int:
    """A PagemapEntry's flags (4); images of old CRIUs have only in_parent (3) or neither (present)."""
    flags = e.get(4)
    if flags is None:
        flags = PE_PARENT if e.get(3) else PE_PRESENT
    return flags


def page_run_stored(flags: int) -> bool:
    """Are the entry's pages stored in this image's pages file (present, not in the parent)?"""
    return bool(flags & PE_PRESENT) and not flags & PE_PARENT


def _pagemap_runs(pm: Path) -> tuple[int, list[int]] | None:
    """A pagemap's pages id and the byte size of each run it stores in pages-<id>.img, in file order
    (None: an empty pagemap). ValueError: a corrupt entry; ColdstartError: a truncated file."""
    entries = [_ints(e) for e in _entries(pm)]
    if not entries:
        return None
    runs = []
    for e in entries[1:]:
        if page_run_stored(pagemap_flags(e)):
            runs.append(e.get(5, e.get(2, 0)) * 4096)  # nr_pages (5), else compat_nr_pages (2)
    return entries[0].get(1, 0), runs


def check_pages(images_dir: str | Path) -> int:
    """Check every pages-N.img holds exactly the bytes its pagemap promises; returns the total.

    Why: stock CRIU 4.2.1's restorer spins forever on a short pages image (preadv keeps
    returning 0), and a mapped short image would SIGBUS the restored process later. A size
    check costs a few small reads and turns both into one clear error before anything runs.
    """
    d = Path(images_dir)
    total = 0
    for pm in sorted(d.glob("pagemap-*.img")):
        try:
            pagemap = _pagemap_runs(pm)
        except ValueError as e:
            raise ColdstartError(f"{pm}: corrupt entry: {e}") from None
        if pagemap is None:
            raise ColdstartError(f"{pm}: empty pagemap")
        pages_id, runs = pagemap
        want = sum(runs)
        pages = d / f"pages-{pages_id}.img"
        have = pages.stat().st_size if pages.exists() else -1
        if have != want:
            what = "missing" if have < 0 else f"{have} bytes"
            raise ColdstartError(f"{pages} does not match {pm.name}: {what}, the pagemap says {want} bytes "
                                 "(truncated or corrupt image)")
        total += want
    if (d / "parent").is_dir():  # the hot layout (criu/layout.py): every page is in the parent
        total += check_pages(d / "parent")
    return total


# Our restore patch (0002/0003) maps private anonymous page runs of at least this size from the pages
# image (`--mmap-pages` with no value) and reads the smaller ones with preadv in the restorer.
MMAP_MIN_KB = 256


def read_runs(images_dir: str | Path, min_kb: int = MMAP_MIN_KB) -> list[tuple[Path, int, int]]:
    """(pages-N.img, offset, length) of the page runs a mmap restore reads rather than maps: the
    present runs smaller than ``min_kb``, adjacent ones merged, in file order.

    Why: the restorer reads them one preadv after another (thousands, tens of KiB each: 2855 reads,
    109 MiB for the bench model); cold, each waits on the disk (results/spot-checks/criu-read-ahead).
    Asked for at once (WILLNEED), they arrive in parallel. A hint: runs of file-backed and jemalloc
    tasks' memory, also read, are not all named. In the hot layout (criu/layout.py) every run of the
    child's images is named, whatever its size (the restore's ReadAhead leaves them to the warmer)."""
    d = Path(images_dir)
    out: list[tuple[Path, int, int]] = []
    limit = min_kb * 1024 if not (d / "parent").is_dir() else 1 << 62
    for pm in sorted(d.glob("pagemap-*.img")):
        try:
            pagemap = _pagemap_runs(pm)
        except (ValueError, ColdstartError):
            continue  # check_pages names a corrupt pagemap; a hint just skips it
        if pagemap is None:
            continue
        pages = d / f"pages-{pagemap[0]}.img"
        off = 0
        for n in pagemap[1]:
            if n < limit:
                if out and out[-1][0] == pages and out[-1][1] + out[-1][2] == off:
                    out[-1] = (pages, out[-1][1], out[-1][2] + n)
                else:
                    out.append((pages, off, n))
            off += n
    return out


ELF_HEAD = 16 << 10  # what CRIU's build-id check reads of a file: its ELF header, program headers, notes


def elf_files(images_dir: str | Path) -> list[str]:
    """The paths (as the dumped tree saw them) of the regular files whose build-id the dump stored:
    at restore CRIU checks each against it by mapping the file's head (files-reg.c,
    validate_with_build_id). Cold, each such first touch waits on the disk, and the fault reads
    around itself (the filesystem's whole readahead window). A hint: [] when files.img is missing
    or does not parse."""
    try:
        entries = _entries(Path(images_dir) / "files.img")
    except (OSError, ColdstartError):
        return []
    out: list[str] = []
    for e in entries:
        try:
            reg = fields(e).get(3)  # FileEntry.reg
            if not reg:
                continue
            f = fields(reg[0])  # RegFileEntry: name (6), build_id (11)
        except ValueError:
            continue
        if f.get(11) and f.get(6):
            out.append(f[6][0].decode(errors="replace"))
    return list(dict.fromkeys(out))


def read_pstree(path: Path) -> list[tuple[int, int]]:
    """(pid, ppid) of every process in pstree.img, root first."""
    out: list[tuple[int, int]] = []
    for i, msg in _entries_at(path):
        try:
            pid, ppid = _pid_ppid(msg)
        except ValueError as e:
            raise ColdstartError(f"{path}: corrupt entry at byte {i}: {e}") from None
        if pid is None:
            raise ColdstartError(f"{path}: entry at byte {i} has no pid")
        out.append((pid, ppid or 0))
    return out


def image_facts(images_dir: str | Path) -> ImageFacts:
    """Size of the page data and the process tree of a dump; raises if it is not a CRIU dump."""
    d = Path(images_dir)
    if not d.is_dir():
        raise ColdstartError(f"{d}: no such image directory")
    if not (d / "inventory.img").exists() or not (d / "pstree.img").exists():
        raise ColdstartError(f"{d}: not a CRIU image directory (no inventory.img / pstree.img)")
    pages = sorted(d.glob("pages-*.img"))
    tree = read_pstree(d / "pstree.img")
    return ImageFacts(
        images_dir=d,
        pages_bytes=sum(p.stat().st_size for p in pages),
        pages_files=len(pages),
        total_bytes=sum(p.stat().st_size for p in d.iterdir() if p.is_file()),
        n_processes=len(tree),
        pids=[p for p, _ in tree],
        root_pid=tree[0][0] if tree else None,
    )
