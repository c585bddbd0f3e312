"""The hot layout: a snapshot's CRIU pages split into the pages a restore touches before its first
token and the rest, as CRIU's incremental images.

Why: CRIU writes each process's pages in address order, so the few a restore needs (43-47 MB of
~1.3 GB) lie spread over thousands of blocks, and every reader (readahead, the warmer, a lazy mount's
1 MiB chunks) fetches ~4-9x them (docs/criu.md, "The hot layout"). Split, the child image holds the
touched pages in one short file that the restorer reads in one pass, and ``parent/`` holds every page
as dumped, mapped lazily by our patched CRIU (patch 0009). No new image format: the child's pagemap
marks the rest ``PE_PARENT``, as an incremental dump would.

The touched set comes from a recording restore (``CRIU_MMAP_PAGES_RECORD=1``: no readahead on the
images, every run mapped), read at its first token from each restored process's page table.
"""
from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from coldstart.criu.images import PE_PARENT, PE_PRESENT, _entries_at, _ints, page_run_stored, pagemap_flags
from coldstart.errors import ColdstartError
from coldstart.fsutil import punch_hole

PARENT = "parent"  # CRIU's name for the parent images directory (CR_PARENT_LINK)
PAGE = 4096
RECORD_ENV = "CRIU_MMAP_PAGES_RECORD"  # our patched CRIU's recording switch (patch 0009)
_TASK_PAGEMAP = re.compile(r"pagemap-(\d+)\.img$")
EARLY_GAP = 64 * 1024  # child_ranges: ranges closer than this are read as one (a read fault maps 64 KiB)
HOT_FIRST_ENV = "COLDSTART_WARM_HOT_FIRST"  # "0": early_ranges names none (the child read whole and first, to compare)


@dataclass(frozen=True)
class Run:
    vaddr: int
    nr_pages: int
    flags: int

    @property
    def present(self) -> bool:
        return page_run_stored(self.flags)


@dataclass(frozen=True)
class Pagemap:
    header: bytes  # the file's magic(s), kept as they were
    pages_id: int
    runs: list[Run]


@dataclass(frozen=True)
class SplitFacts:
    """What a split wrote: per process (its PID in the images) the bytes kept in the child; the
    names of the files that moved to parent/ (and were written anew in the child); the bytes of the
    parent's pages files made holes (the child's copy is the one a restore reads)."""
    child_bytes: dict[int, int]
    parent_bytes: int
    moved: list[str]
    parent_holes: int = 0

    @property
    def total_child_bytes(self) -> int:
        return sum(self.child_bytes.values())


def read_pagemap(path: Path) -> Pagemap:
    """A task's pagemap-N.img: its pages id and its runs, in file order."""
    entries = _entries_at(path)
    if not entries:
        raise ColdstartError(f"{path}: empty pagemap")
    head = _ints(entries[0][1])
    runs = []
    for _, msg in entries[1:]:
        f = _ints(msg)
        runs.append(Run(vaddr=f[1], nr_pages=f.get(5, f.get(2, 0)), flags=pagemap_flags(f)))
    return Pagemap(header=path.read_bytes()[:entries[0][0] - 4], pages_id=head.get(1, 0), runs=runs)


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_pagemap(pm: Pagemap) -> bytes:
    """pagemap-N.img bytes: the header, a PagemapHead, then one PagemapEntry per run (vaddr,
    compat_nr_pages = 0, flags, nr_pages: what CRIU 4.x writes)."""
    def entry(msg: bytes) -> bytes:
        return struct.pack("<I", len(msg)) + msg

    out = [pm.header, entry(b"\x08" + _varint(pm.pages_id))]
    for r in pm.runs:
        out.append(entry(b"\x08" + _varint(r.vaddr) + b"\x10\x00" + b"\x20" + _varint(r.flags)
                         + b"\x28" + _varint(r.nr_pages)))
    return b"".join(out)


def task_pagemaps(images_dir: Path) -> dict[int, Path]:
    """The tasks' pagemap-PID.img files of an image directory, by PID (shmem pagemaps left out)."""
    out = {}
    for p in sorted(Path(images_dir).glob("pagemap-*.img")):
        m = _TASK_PAGEMAP.search(p.name)
        if m:
            out[int(m.group(1))] = p
    return out


def present_pages(pid: int, runs: list[Run]) -> set[int]:
    """The page numbers (vaddr / 4096) of ``runs`` that are present in process ``pid``'s page table
    (mapped from the page cache or written), from /proc/PID/pagemap."""
    out: set[int] = set()
    fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
    try:
        for r in runs:
            if not r.present:
                continue
            first = r.vaddr // PAGE
            data = os.pread(fd, 8 * r.nr_pages, 8 * first)
            for i, (e,) in enumerate(struct.iter_unpack("<Q", data)):
                if e >> 63:
                    out.add(first + i)
    finally:
        os.close(fd)
    return out


def tree_pids(root: int) -> dict[int, int]:
    """A restored tree's processes: PID in its namespace (as in the images) -> PID here."""
    from coldstart.criu.restore import descendants, inner_pid

    return {inner_pid(p): p for p in [root, *descendants(root)]}


def stored_pages(runs: list[Run], file_pages) -> set[int]:
    """The page numbers (vaddr / 4096) stored at the pages-image page indexes ``file_pages`` (a
    sequence of bools, one per page of the pages image, e.g. its page-cache residency)."""
    out: set[int] = set()
    i = 0
    for r in runs:
        if not r.present:
            continue
        first = r.vaddr // PAGE
        out.update(first + k for k in range(r.nr_pages) if i + k < len(file_pages) and file_pages[i + k])
        i += r.nr_pages
    return out


def record(images_dir: Path, pids: dict[int, int], read: dict[str, object] | None = None) -> dict[int, set[int]]:
    """The touched pages of each process, by its PID in the images: those present in a recording
    restore's live processes (``pids``: PID in the images -> PID here) and, per pages image name,
    those ``read`` says were read (bools per page: the page cache after the recording also holds
    pages a process touched and dropped again before its first token)."""
    out = {}
    for ipid, path in task_pagemaps(images_dir).items():
        host = pids.get(ipid)
        if host is None:
            raise ColdstartError(f"the recording restore has no process {ipid} of the images")
        pm = read_pagemap(path)
        out[ipid] = present_pages(host, pm.runs)
        if read and f"pages-{pm.pages_id}.img" in read:
            out[ipid] |= stored_pages(pm.runs, read[f"pages-{pm.pages_id}.img"])
    return out


def _split_runs(runs: list[Run], hot: set[int]) -> list[tuple[Run, int]]:
    """The child's runs, each with its byte offset in the parent's pages file (-1: not present)."""
    out: list[tuple[Run, int]] = []
    off = 0
    for r in runs:
        if not r.present:
            out.append((r, -1))
            continue
        first = r.vaddr // PAGE
        i = 0
        while i < r.nr_pages:
            h = (first + i) in hot
            j = i + 1
            while j < r.nr_pages and ((first + j) in hot) == h:
                j += 1
            flags = r.flags if h else (r.flags & ~PE_PRESENT) | PE_PARENT
            out.append((Run(vaddr=(first + i) * PAGE, nr_pages=j - i, flags=flags), off + i * PAGE if h else -1))
            i = j
        off += r.nr_pages * PAGE
    return out


def split(images_dir: Path, hot: dict[int, set[int]]) -> SplitFacts:
    """Rewrite ``images_dir`` in the hot layout: its tasks' pagemap and pages images move to
    ``images_dir/parent/``, and a child pagemap and pages image in their place keep the ``hot``
    pages present (in address order, one file per task) and mark the rest in-parent. The parent's
    copies of the hot pages become holes, as CRIU's own ``--auto-dedup`` does for pages a newer
    image holds: nothing reads them (CRIU only counts its way past them), and without them the
    pages a restore touches are not stored twice (bench model with packed handles kept: 1.3 GB)."""
    images_dir = Path(images_dir)
    parent = images_dir / PARENT
    if parent.exists():
        raise ColdstartError(f"{images_dir} already has a {PARENT}/ directory (split twice?)")
    todo = []
    for ipid, pm_path in task_pagemaps(images_dir).items():
        pm = read_pagemap(pm_path)
        if any(r.flags & PE_PARENT for r in pm.runs):
            raise ColdstartError(f"{pm_path} already refers to a parent image")
        pages = images_dir / f"pages-{pm.pages_id}.img"
        todo.append((ipid, pm_path, pm, pages))
    staged = parent.with_name(PARENT + ".tmp")
    staged.mkdir()
    child_bytes: dict[int, int] = {}
    parent_bytes = holes = 0
    for ipid, pm_path, pm, pages in todo:
        runs = _split_runs(pm.runs, hot.get(ipid, set()))
        kept = 0
        with open(pages, "r+b") as src, open(staged / pages.name, "wb") as dst:
            for r, off in runs:
                if off >= 0:
                    n = r.nr_pages * PAGE
                    done = 0
                    while done < n:
                        k = os.copy_file_range(src.fileno(), dst.fileno(), n - done, off + done)
                        if k <= 0:
                            raise ColdstartError(f"{pages}: short read at {off + done} (truncated image)")
                        done += k
                    kept += n
            dst.flush()
            os.fsync(dst.fileno())
            for r, off in runs:  # only once the child's copy is on disk
                if off >= 0 and punch_hole(src.fileno(), off, r.nr_pages * PAGE):
                    holes += r.nr_pages * PAGE
            os.fsync(src.fileno())
        (staged / pm_path.name).write_bytes(encode_pagemap(Pagemap(pm.header, pm.pages_id, [r for r, _ in runs])))
        child_bytes[ipid] = kept
        parent_bytes += pages.stat().st_size
    # the dumped images move into parent/, the child's take their names
    parent.mkdir()
    for _, pm_path, _, pages in todo:
        os.rename(pm_path, parent / pm_path.name)
        os.rename(pages, parent / pages.name)
        os.rename(staged / pm_path.name, pm_path)
        os.rename(staged / pages.name, pages)
    staged.rmdir()
    moved = sorted(n for _, pm_path, _, pages in todo for n in (pm_path.name, pages.name))
    return SplitFacts(child_bytes=child_bytes, parent_bytes=parent_bytes, moved=moved, parent_holes=holes)


def child_ranges(images_dir: Path, pages: dict[int, set[int]], gap: int = EARLY_GAP) -> dict[str, list[list[int]]]:
    """Where ``pages`` (page numbers by the process's PID in the images) lie in the split images'
    child pages files: per file name, [offset, length] byte ranges in file order, those less than
    ``gap`` apart joined. Pages the child does not hold are left out."""
    out: dict[str, list[list[int]]] = {}
    for ipid, path in task_pagemaps(images_dir).items():
        want = pages.get(ipid)
        if not want:
            continue
        pm = read_pagemap(path)
        ranges: list[list[int]] = []
        off = 0
        for r in pm.runs:
            if not r.present:
                continue
            first = r.vaddr // PAGE
            for k in range(r.nr_pages):
                if first + k not in want:
                    continue
                at = off + k * PAGE
                if ranges and at - (ranges[-1][0] + ranges[-1][1]) < gap:
                    ranges[-1][1] = at + PAGE - ranges[-1][0]
                else:
                    ranges.append([at, PAGE])
            off += r.nr_pages * PAGE
        if ranges:
            out[f"pages-{pm.pages_id}.img"] = ranges
    return out


def early_ranges(images_dir: Path, early: object) -> list[tuple[Path, int, int]]:
    """(file, offset, length) in ``images_dir`` of the ranges ``early`` names (a manifest's
    ``layout.early``, as child_ranges wrote it), in its order, each within its file. A hint for the
    readers that take them first: anything malformed is skipped, and none is named without a record
    or with HOT_FIRST_ENV=0."""
    if not isinstance(early, dict) or os.environ.get(HOT_FIRST_ENV, "1") == "0":
        return []
    out: list[tuple[Path, int, int]] = []
    for name, ranges in sorted(early.items()):
        path = Path(images_dir) / str(name)
        try:
            size = path.stat().st_size
        except OSError:
            continue
        for r in ranges if isinstance(ranges, list) else ():
            if isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) for x in r) \
                    and 0 <= r[0] < size and r[1] > 0:
                out.append((path, r[0], min(r[1], size - r[0])))
    return out
