"""Which of a snapshot's dumped pages a restored server has mapped in, by the kind of mapping they
belong to (experiments/snapshot_anatomy.py's categories) and per VMA: what a restore needed of its
memory image so far. Where snapshot_anatomy says what a dump holds, this says what a restore uses,
so a diet knows which kind of page to go after.

Restores SNAPSHOT with the page cache dropped (`coldstart restore SNAP --no-serve`: returns at READY,
the server left running), reads each restored process's page table (/proc/PID/pagemap, present bit)
over its mappings of pages-*.img, attributes every present page to the dumped VMA holding it (by
the process's PID in its own namespace, which the restore keeps), then ends the server's PID namespace. Run it on
the host that made the dump (the anatomy reads libraries' ELF headers from the dumped paths).

    .venv/bin/python experiments/first_token_pages.py SNAPSHOT_DIR [--json OUT]
"""
from __future__ import annotations

import argparse
import bisect
import json
import re
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import snapshot_anatomy as sa
from coldstart.warm.residency import drop_caches
from coldstart.bench.pipeline import kill_restored

PAGES = re.compile(r"/pages-\d+\.img( \(deleted\))?$")
MIB = 2**20


def ns_pid(pid: int) -> int:
    """The PID a process has in its innermost namespace (the one CRIU restored it with)."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("NSpid:")).split()[-1])


def restored_tree(root: int) -> list[int]:
    import psutil

    p = psutil.Process(root)
    return [p.pid] + [c.pid for c in p.children(recursive=True)]


def present(pid: int, procs: dict[int, sa.Proc]) -> Counter:
    """(snapshot PID, VMA start, category, file) -> present pages of that VMA in the pages files' mappings."""
    pr = procs.get(ns_pid(pid))
    out: Counter = Counter()
    if pr is None:
        return out
    starts = [v.start for v in pr.vmas]
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pm:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or not PAGES.search(parts[5].rstrip("\n")):
                continue
            a, b = (int(x, 16) for x in parts[0].split("-"))
            pm.seek(a // sa.PAGE * 8)
            data = pm.read((b - a) // sa.PAGE * 8)
            for k, (e,) in enumerate(struct.iter_unpack("<Q", data)):
                if not e >> 63:
                    continue
                addr = a + k * sa.PAGE
                i = bisect.bisect_right(starts, addr) - 1
                v = pr.vmas[i] if i >= 0 and addr < pr.vmas[i].end else None
                out[(pr.pid, v.start if v else 0, v.category if v else "outside any VMA", v.file if v else "")] += 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    d = a.snapshot / "criu"
    procs = {p.pid: p for p in sa.read_procs(d, sa.file_names(d))}
    drop_caches()
    r = subprocess.run([sys.executable, "-m", "coldstart", "restore", str(a.snapshot), "--no-serve", "--no-fallback",
                        "--timeline-out", "/dev/null"], capture_output=True, text=True)
    summary = next((json.loads(line) for line in r.stdout.splitlines() if line.startswith('{"url"')), None)
    if r.returncode != 0 or not summary or not summary.get("restored"):
        print(f"restore failed (exit {r.returncode}): {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
        return 1
    root = summary["pid"]
    try:
        pages: Counter = Counter()
        for pid in restored_tree(root):
            pages.update(present(pid, procs))
    finally:
        kill_restored(root)
    by_cat: Counter = Counter()
    for (pid, _, cat, _), n in pages.items():
        by_cat[(pid, procs[pid].name, cat)] += n
    total = sum(pages.values())
    print(f"{a.snapshot.name}: {total * sa.PAGE / MIB:.1f} MiB of CRIU pages mapped in at READY "
          f"(restore's own figure at the first token: {summary['attrs'].get('FIRST_TOKEN', {}).get('pages_mapped_bytes', 0) / MIB:.1f} MiB)")
    print(f"  {'pid':>6} {'process':<16} {'category':<16} {'MiB':>8}")
    for (pid, name, cat), n in sorted(by_cat.items()):
        print(f"  {pid:>6} {name:<16} {cat:<16} {n * sa.PAGE / MIB:8.1f}")
    print("  largest 15 VMAs by mapped pages:")
    for (pid, start, cat, file), n in pages.most_common(15):
        v = next((v for v in procs[pid].vmas if v.start == start), None)
        size = (v.end - v.start) / MIB if v else 0
        print(f"  {pid:>6} {start:14x} {cat:<14} {n * sa.PAGE / MIB:7.1f} MiB of a {size:7.1f} MiB VMA {Path(file).name}")
    if a.json:
        a.json.write_text(json.dumps({"snapshot": a.snapshot.name, "mapped_bytes": total * sa.PAGE,
                                      "by_category": [{"pid": p, "process": n, "category": c, "bytes": k * sa.PAGE}
                                                      for (p, n, c), k in sorted(by_cat.items())]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
