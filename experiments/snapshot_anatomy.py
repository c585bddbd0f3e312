"""Where the bytes of a CRIU snapshot's memory pages go, per process and per mapping.

A dump's pages-N.img is most of a snapshot and most of what a restore reads, so before trying to
shrink it we need to know what it holds. This reads the images directly (no crit): mm-PID.img's
VMAs, pagemap-PID.img's runs of dumped pages (page data follows in pages-N.img in the same order),
files.img for the paths of file mappings and core-TID.img for thread names and stack pointers.
Every dumped page is attributed to the VMA holding it, checked for being all zero and hashed
(blake2b-128) to count pages that another process of the tree dumps byte for byte too.
A library's .bss is told apart from neighbouring mmaps by reading its ELF headers from the path
the dump recorded, so run this on the host that made the dump. Contents of anonymous shared
memory and memfds go to pages images no process pagemap names; they are listed, not analysed.

    .venv/bin/python experiments/snapshot_anatomy.py SNAPSHOT_DIR [--json OUT]
"""
from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import struct
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from coldstart.criu.images import PE_PARENT, PE_PRESENT, _entries, fields

PAGE = 4096
MIB = 2**20
ZERO_PAGE = bytes(PAGE)

# VMA status bits, criu/include/image.h (CRIU 4.2.1)
VMA_AREA_STACK, VMA_AREA_HEAP = 1 << 1, 1 << 5
VMA_FILE_PRIVATE, VMA_FILE_SHARED, VMA_ANON_SHARED, VMA_ANON_PRIVATE = 1 << 6, 1 << 7, 1 << 8, 1 << 9
VMA_AREA_SYSVIPC, VMA_AREA_MEMFD = 1 << 10, 1 << 14
FD_REG, FD_MEMFD = 1, 18  # fd_types, images/fdinfo.proto
MAP_SHARED, PT_LOAD = 0x01, 1
CATEGORIES = ["heap", "anon private", "lib .bss", "stack", "file private", "shared memory", "other"]


def first(f: dict[int, list], num: int, default=None):
    return f[num][0] if f.get(num) else default


@dataclass
class Vma:
    start: int
    end: int
    prot: int
    flags: int
    status: int
    category: str
    file: str = ""
    pgoff: int = 0
    dumped_pages: int = 0
    zero_pages: int = 0
    shared_pages: int = 0  # non-zero pages whose content another process also dumped

    @property
    def perms(self) -> str:
        rwx = "".join(c if self.prot & b else "-" for c, b in (("r", 1), ("w", 2), ("x", 4)))
        return rwx + ("s" if self.flags & MAP_SHARED else "p")


@dataclass
class Proc:
    pid: int
    ppid: int
    name: str
    pages_file: str
    pages_file_bytes: int
    vmas: list[Vma]
    mm_vmas: int = 0  # as listed in mm-PID.img, before .bss splits
    dumped_pages: int = 0
    zero_pages: int = 0
    unmapped_pages: int = 0  # dumped pages in no VMA (should stay 0)
    distinct_nonzero: int = 0  # distinct non-zero contents within this process
    shared_with_others: int = 0  # non-zero pages whose content another process also dumped


def file_names(d: Path) -> dict[int, str]:
    """File id -> path for regular files and memfds, marking files CRIU had to remap (deleted)."""
    remap = d / "remap-fpath.img"
    remapped = {first(fields(e), 1) for e in _entries(remap)} if remap.exists() else set()
    names: dict[int, str] = {}
    for e in _entries(d / "files.img"):
        f = fields(e)
        kind, fid = first(f, 1), first(f, 2)
        if kind == FD_REG and f.get(3):
            names[fid] = first(fields(first(f, 3)), 6, b"?").decode(errors="replace")
        elif kind == FD_MEMFD:
            names[fid] = f"memfd (inode id {first(fields(first(f, 20)), 5)})"
        if fid in remapped:
            names[fid] = names.get(fid, "?") + " (deleted)"
    return names


def thread_info(d: Path, tid: int) -> tuple[str, int]:
    """(comm, stack pointer) of one thread from core-TID.img."""
    core = fields(_entries(d / f"core-{tid}.img")[0])
    tc, th = fields(first(core, 3, b"")), fields(first(core, 5, b""))
    comm = first(tc, 6) or first(th, 13) or b""
    regs = fields(first(fields(first(core, 2, b"")), 2, b""))
    return comm.decode(errors="replace"), first(regs, 20, 0)


@cache
def elf_extent(path: str) -> tuple[int, int] | None:
    """(lowest p_vaddr, highest p_vaddr + p_memsz) of an ELF's PT_LOAD segments, None if unreadable.

    Why: the loader maps the part of .bss past the file's last page as anonymous memory, so the
    VMA list alone cannot tell a library's .bss from an mmap that happens to land next to it.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:
                return None
            phoff, = struct.unpack_from("<Q", head, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return None
    loads = [struct.unpack_from("<IIQQQQQ", table, i * phentsize) for i in range(phnum)]
    loads = [(vaddr, vaddr + memsz) for ptype, _, _, vaddr, _, _, memsz in loads if ptype == PT_LOAD]
    return (min(a for a, _ in loads), max(b for _, b in loads)) if loads else None


def split_bss(vmas: list[Vma]) -> list[Vma]:
    """Relabel the anonymous tail of each mapped ELF image (its .bss) as 'lib .bss' of that file."""
    images: dict[str, tuple[int, int]] = {}  # file -> (load base, image end)
    for v in vmas:
        ext = elf_extent(v.file) if v.category == "file private" and v.pgoff == 0 else None
        if ext and v.file not in images:
            base = v.start - (ext[0] & ~(PAGE - 1))
            images[v.file] = (v.start, base + (ext[1] + PAGE - 1) // PAGE * PAGE)
    out: list[Vma] = []
    for v in vmas:
        owner = next(((f, e) for f, (b, e) in images.items() if b <= v.start < e), None)
        if v.category != "anon private" or owner is None:
            out.append(v)
            continue
        name, end = owner
        out.append(Vma(v.start, min(v.end, end), v.prot, v.flags, v.status, "lib .bss", name))
        if v.end > end:  # an anonymous mapping the kernel merged onto the .bss
            out.append(Vma(end, v.end, v.prot, v.flags, v.status, v.category))
    return out


def categorize(status: int, start: int, end: int, sps: list[int]) -> str:
    if status & VMA_AREA_HEAP:
        return "heap"
    if status & VMA_AREA_STACK or any(start <= sp < end for sp in sps):
        return "stack"
    if status & (VMA_FILE_SHARED | VMA_ANON_SHARED | VMA_AREA_SYSVIPC | VMA_AREA_MEMFD):
        return "shared memory"
    if status & VMA_FILE_PRIVATE:
        return "file private"
    if status & VMA_ANON_PRIVATE:
        return "anon private"
    return "other"  # vdso, vvar, vsyscall, ...


def read_proc(d: Path, pid: int, ppid: int, threads: list[int], names: dict[int, str]) -> Proc:
    comm = thread_info(d, pid)[0] or str(pid)
    sps = [thread_info(d, t)[1] for t in threads]
    mm = fields(_entries(d / f"mm-{pid}.img")[0])
    vmas = []
    for raw in mm.get(14, []):
        v = fields(raw)
        start, end, status = first(v, 1), first(v, 2), first(v, 7)
        fid = first(v, 4, 0)
        is_file = status & (VMA_FILE_PRIVATE | VMA_FILE_SHARED | VMA_AREA_MEMFD)
        fname = names.get(fid, f"file id {fid}") if is_file else ""
        vmas.append(Vma(start, end, first(v, 5), first(v, 6), status, categorize(status, start, end, sps), fname,
                        pgoff=first(v, 3, 0)))
    vmas = split_bss(sorted(vmas, key=lambda v: v.start))
    pages_id = first(fields(_entries(d / f"pagemap-{pid}.img")[0]), 1)
    pages = d / f"pages-{pages_id}.img"
    return Proc(pid, ppid, comm, pages.name, pages.stat().st_size, vmas, mm_vmas=len(mm.get(14, [])))


def read_procs(d: Path, names: dict[int, str]) -> list[Proc]:
    """Every process of the dumped tree (pstree.img), with its VMAs."""
    procs = []
    for raw in _entries(d / "pstree.img"):
        f = fields(raw)
        pid = first(f, 1)
        procs.append(read_proc(d, pid, first(f, 2, 0), f.get(5) or [pid], names))
    return procs


def scan_pages(d: Path, proc: Proc, seen: dict[bytes, int], bit: int) -> list[tuple[Vma | None, bytes]]:
    """Attribute each dumped page to its VMA and count zero pages; returns (VMA, digest) of the rest.

    Each digest's entry in `seen` gets this process's bit, so sharing is known once all are read.
    """
    starts = [v.start for v in proc.vmas]
    digests: list[tuple[Vma | None, bytes]] = []
    with open(d / proc.pages_file, "rb") as pages:
        for raw in _entries(d / f"pagemap-{proc.pid}.img")[1:]:
            e = fields(raw)
            flags = first(e, 4)
            present = (flags & PE_PRESENT and not flags & PE_PARENT) if flags is not None else not first(e, 3, 0)
            if not present:
                continue
            vaddr, n = first(e, 1), first(e, 5, first(e, 2, 0))
            data = pages.read(n * PAGE)
            if len(data) != n * PAGE:
                raise SystemExit(f"{proc.pages_file}: short read at page run {vaddr:#x}")
            for k in range(n):
                page, addr = data[k * PAGE : (k + 1) * PAGE], vaddr + k * PAGE
                i = bisect.bisect_right(starts, addr) - 1
                vma = proc.vmas[i] if i >= 0 and addr < proc.vmas[i].end else None
                zero = page == ZERO_PAGE
                proc.dumped_pages += 1
                proc.zero_pages += zero
                if vma is None:
                    proc.unmapped_pages += 1
                else:
                    vma.dumped_pages += 1
                    vma.zero_pages += zero
                if not zero:
                    digests.append((vma, hashlib.blake2b(page, digest_size=16).digest()))
        if pages.read(1):
            raise SystemExit(f"{proc.pages_file}: data left after the last pagemap entry")
    mine = {h for _, h in digests}
    proc.distinct_nonzero = len(mine)
    for h in mine:
        seen[h] = seen.get(h, 0) | bit
    return digests


def mib(pages: int) -> str:
    return f"{pages * PAGE / MIB:9.1f}"


def category_rows(vmas: list[Vma]) -> dict[str, dict[str, int]]:
    rows = {c: {"vmas": 0, "mapped_pages": 0, "dumped_pages": 0, "zero_pages": 0, "shared_pages": 0}
            for c in CATEGORIES}
    for v in vmas:
        r = rows[v.category]
        r["vmas"] += 1
        r["mapped_pages"] += (v.end - v.start) // PAGE
        r["dumped_pages"] += v.dumped_pages
        r["zero_pages"] += v.zero_pages
        r["shared_pages"] += v.shared_pages
    return rows


def print_categories(rows: dict[str, dict[str, int]], total: int) -> None:
    print(f"  {'category':<15}{'VMAs':>6}{'mapped MiB':>12}{'dumped MiB':>11}{'zero MiB':>10}{'in other':>10}"
          f"{'share':>8}")
    for c, r in rows.items():
        share = 100 * r["dumped_pages"] / total if total else 0
        print(f"  {c:<15}{r['vmas']:>6}{mib(r['mapped_pages']):>12}{mib(r['dumped_pages']):>11}"
              f"{mib(r['zero_pages']):>10}{mib(r['shared_pages']):>10}{share:>7.1f}%")


def print_files(vmas: list[Vma], top: int = 10) -> None:
    """Dirty pages of private file mappings plus their anonymous .bss, summed per file."""
    by_file: Counter[str] = Counter()
    for v in vmas:
        if v.category in ("file private", "lib .bss"):
            by_file[v.file] += v.dumped_pages
    print(f"  file private + lib .bss, top {top} files by dumped MiB:")
    for name, n in by_file.most_common(top):
        print(f"    {mib(n)}  {name}")


def print_top(vmas: list[Vma], top: int = 15) -> None:
    print(f"  largest {top} VMAs by dumped bytes:")
    print(f"    {'range':<29} {'perm':<5}{'size MiB':>9}{'dumped':>10}{'zero':>8}{'in other':>10}  "
          f"{'category':<14} file")
    for v in sorted(vmas, key=lambda v: v.dumped_pages, reverse=True)[:top]:
        print(f"    {v.start:012x}-{v.end:012x}  {v.perms:<5}{(v.end - v.start) / MIB:>9.1f}{mib(v.dumped_pages):>10}"
              f"{mib(v.zero_pages):>8}{mib(v.shared_pages):>10}  {v.category:<14} {v.file}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot", type=Path, help="snapshot directory (holds criu/)")
    ap.add_argument("--json", type=Path, help="write the per-process figures here")
    args = ap.parse_args()
    # file names print relative to the venv: the output is committed, this machine's paths are not
    venvs = sorted({str(Path(sys.prefix)), str(Path(sys.prefix).resolve())}, key=len, reverse=True)  # .venv is a link

    def redact(text: str) -> str:
        for v in venvs:
            text = text.replace(v, "<venv>")
        return text.replace(sys.base_prefix, "<python>")
    out_stream = sys.stdout
    sys.stdout = type("Redacted", (), {"write": lambda self, t: out_stream.write(redact(t)),
                                       "flush": lambda self: out_stream.flush()})()
    d = args.snapshot / "criu" if (args.snapshot / "criu").is_dir() else args.snapshot
    names = file_names(d)
    procs = read_procs(d, names)
    seen: dict[bytes, int] = {}
    digests = [scan_pages(d, p, seen, 1 << i) for i, p in enumerate(procs)]
    for i, (p, pages) in enumerate(zip(procs, digests)):
        for vma, h in pages:
            if seen[h] & ~(1 << i):
                p.shared_with_others += 1
                if vma is not None:
                    vma.shared_pages += 1
    del digests

    ok = True
    for p in procs:
        total = p.dumped_pages
        recon = "ok" if total * PAGE == p.pages_file_bytes else "MISMATCH"
        ok &= recon == "ok"
        print(f"\n== pid {p.pid} ({p.name}), parent {p.ppid}: {p.pages_file} {p.pages_file_bytes / MIB:.1f} MiB, "
              f"pagemap says {total * PAGE / MIB:.1f} MiB [{recon}]; {p.mm_vmas} VMAs, "
              f"{p.unmapped_pages} dumped pages outside any VMA")
        print_categories(category_rows(p.vmas), total)
        print_files(p.vmas)
        print_top(p.vmas)

    all_vmas = [v for p in procs for v in p.vmas]
    grand = sum(p.dumped_pages for p in procs)
    print(f"\n== all {len(procs)} processes: {grand * PAGE / MIB:.1f} MiB dumped")
    print_categories(category_rows(all_vmas), grand)
    print_files(all_vmas)
    for other in sorted(set(d.glob("pages-*.img")) - {d / p.pages_file for p in procs}):
        print(f"  {other.name}: {other.stat().st_size / MIB:.1f} MiB named by no process pagemap (shmem, memfd)")

    print("\n== zero and duplicate pages (4 KiB, blake2b-128)")
    print(f"  {'process':<24}{'dumped MiB':>11}{'zero MiB':>10}{'dup within':>12}{'also in another':>17}")
    for p in procs:
        within = p.dumped_pages - p.zero_pages - p.distinct_nonzero
        print(f"  {f'{p.pid} {p.name}':<24}{mib(p.dumped_pages):>11}{mib(p.zero_pages):>10}{mib(within):>12}"
              f"{mib(p.shared_with_others):>17}")
    zero = sum(p.zero_pages for p in procs)
    multi = sum(1 for m in seen.values() if m & (m - 1))
    print(f"  non-zero contents: {len(seen)} distinct pages ({mib(len(seen)).strip()} MiB), "
          f"{multi} of them ({mib(multi).strip()} MiB) dumped by more than one process")
    print(f"  a zero-skipping, content-addressed store would hold {mib(len(seen)).strip()} MiB of "
          f"{mib(grand).strip()} MiB ({100 * len(seen) / grand:.1f}%); zero pages alone are {mib(zero).strip()} MiB")

    if args.json:
        out = {"snapshot": args.snapshot.name, "page_size": PAGE, "distinct_nonzero_pages": len(seen),
               "multi_process_pages": multi,
               "processes": [{**{k: v for k, v in asdict(p).items() if k != "vmas"},
                              "categories": category_rows(p.vmas),
                              "vmas": [asdict(v) | {"perms": v.perms} for v in p.vmas if v.dumped_pages]}
                             for p in procs]}
        args.json.write_text(redact(json.dumps(out, indent=1)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
