"""How far the snapshot diet can go on the node's disk: the floors, measured on a live server.

Two floors, each beside what the snapshot holds in the same run:
- image: the anonymous memory of a bare ``import torch`` and of a bare ``import
  vllm.entrypoints.openai.api_server`` (what each of a snapshot's two processes holds before it has
  done anything), against the private memory of a live server asleep at level 2 (what CRIU dumps)
  and the CRIU pages of a checkpoint of the same model;
- pages before the first token: the private pages a live, never-dumped server touches while it does
  what a restore does after CRIU (wake the weights, map reload, wake the KV cache, the canary):
  ``/proc/PID/clear_refs`` before, the ``Referenced`` pages of what was resident at sleep after.
  Against the CRIU pages a restore of the checkpoint mapped in before its first token
  (``pages_mapped_bytes``, page cache dropped), split by the restored processes' page tables
  (/proc/PID/pagemap at READY) into pages written (copied on write: anonymous) and pages mapped
  from the image file, and counted in 64 KiB blocks: the kernel maps a read fault's whole
  fault-around block (``fault_around_bytes``, 64 KiB) when its pages are in the page cache.

    cd experiments && ../.venv/bin/python diet_floor.py --model /var/cache/coldstart/models/tiny-seed0 \\
        --work /var/tmp/coldstart-dietfloor --out ../results/spot-checks/diet-executor/tiny-floor.jsonl
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import psutil

from coldstart.warm.residency import drop_caches
from coldstart.bench.pipeline import kill_restored
from coldstart.engine.launcher import EngineSpec, free_port, start_engine
from coldstart.pipeline.checkpoint import reload_weights, _weights_entry
from first_token_pages import restored_tree

ROOT = Path(__file__).resolve().parents[1]
CLI = [str(ROOT / ".venv" / "bin" / "coldstart")]
PAGES = re.compile(r"/pages-\d+\.img( \(deleted\))?$")
CANARY = "The capital of France is"
IMPORT = ("import sys, {mod}\n"
          "a = [l for l in open('/proc/self/smaps_rollup') if l.startswith('Anonymous')][0].split()[1]\n"
          "print(int(a) * 1024, len(sys.modules))")


def bare_import(module: str) -> dict:
    """Anonymous bytes and module count of a fresh interpreter that imported ``module`` only."""
    p = subprocess.run([sys.executable, "-c", IMPORT.format(mod=module)], capture_output=True, text=True,
                       check=True)
    anon, mods = p.stdout.split()[-2:]
    return {"module": module, "anon_bytes": int(anon), "modules": int(mods)}


def vmas(pid: int) -> dict[str, dict[str, int]]:
    """Per mapping (its address range): Anonymous and Referenced bytes, from /proc/PID/smaps."""
    out: dict[str, dict[str, int]] = {}
    cur = None
    for line in open(f"/proc/{pid}/smaps"):
        f = line.split()
        if "-" in f[0] and len(f) >= 5 and ":" in f[3]:
            cur = out.setdefault(f[0], {"anon": 0, "ref": 0})
        elif f[0] in ("Anonymous:", "Referenced:") and cur is not None:
            cur["anon" if f[0] == "Anonymous:" else "ref"] += int(f[1]) * 1024
    return out


def touched(before: dict, after: dict) -> int:
    """Bytes of the private pages resident at ``before`` that were referenced by ``after``."""
    return sum(min(after[k]["ref"], v["anon"]) for k, v in before.items() if k in after and v["anon"])


def live(model: Path, work: Path) -> dict:
    """A server set up as `coldstart checkpoint` sets it up, asleep, then woken as a restore wakes it."""
    run = work / "live"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    spec = EngineSpec(model=model, run_dir=run / "run", port=free_port(), sleep_mode=True, device="cpu",
                      die_with_parent=True)
    eng = start_engine(spec, new_pidns=False)
    try:
        eng.wait_ready(600)
        c = spec.client(timeout=300)
        c.score(CANARY)
        res = c.collective_rpc("coldstart_dump_weights", kwargs={"out_dir": str(run / "weights")})
        weights = _weights_entry(run, run / "weights", res)
        c.sleep(level=2)
        c.wake_up(["weights"])
        reload_weights(c, run, weights, mode="map")
        c.wake_up(["kv_cache"])
        c.score(CANARY)
        c.sleep(level=2)
        time.sleep(1.0)
        pids = [p for p in eng.pids() if sum(v["anon"] for v in vmas(p).values()) > 64 << 20]
        asleep = {p: vmas(p) for p in pids}
        for p in pids:
            Path(f"/proc/{p}/clear_refs").write_text("1")
        c.wake_up(["weights"])
        reload_weights(c, run, weights, mode="map")
        c.wake_up(["kv_cache"])
        c.score(CANARY)
        woken = {p: vmas(p) for p in pids}
        for p in pids:
            Path(f"/proc/{p}/clear_refs").write_text("1")
        c.score(CANARY)
        again = {p: vmas(p) for p in pids}
        procs = [{"name": psutil.Process(p).name(),
                  "asleep_anon_bytes": sum(v["anon"] for v in asleep[p].values()),
                  "wake_to_canary_touched_bytes": touched(asleep[p], woken[p]),
                  "one_more_canary_touched_bytes": touched(asleep[p], again[p])} for p in pids]
        return {"processes": procs,
                "asleep_anon_bytes": sum(x["asleep_anon_bytes"] for x in procs),
                "wake_to_canary_touched_bytes": sum(x["wake_to_canary_touched_bytes"] for x in procs),
                "one_more_canary_touched_bytes": sum(x["one_more_canary_touched_bytes"] for x in procs)}
    finally:
        eng.stop()
        shutil.rmtree(run, ignore_errors=True)


def restore_live(snap: Path, extra: list[str] = (), timeout: float = 900) -> tuple[dict, subprocess.CompletedProcess]:
    """`coldstart restore SNAP --no-serve --no-fallback` (the server left running): its summary line
    ({} when it printed none) and the finished process."""
    p = subprocess.run([*CLI, "restore", str(snap), "--no-serve", "--no-fallback", *extra],
                       capture_output=True, text=True, timeout=timeout)
    return next((json.loads(x) for x in reversed(p.stdout.splitlines()) if x.startswith('{"url"')), {}), p


def image_pages_present(root: int):
    """Each present page of the restored tree's pages-*.img mappings, from /proc/PID/pagemap:
    (pid, the mapping's first page, image file name, page number, offset in the image, written),
    written meaning copied on write (anonymous) rather than mapped from the file."""
    for pid in restored_tree(root):
        try:
            maps = open(f"/proc/{pid}/maps").read().splitlines()
            pm = open(f"/proc/{pid}/pagemap", "rb")
        except OSError:
            continue
        with pm:
            for line in maps:
                f = line.split()
                if len(f) < 6 or not PAGES.search(f[5]):
                    continue
                a, b = (int(x, 16) >> 12 for x in f[0].split("-"))
                off, name = int(f[2], 16), Path(f[5]).name
                pm.seek(a * 8)
                for i, e in enumerate(struct.unpack(f"{b - a}Q", pm.read((b - a) * 8))):
                    if e >> 63 & 1:
                        yield pid, a, name, a + i, off + i * 4096, not e >> 61 & 1


def image_pages(root: int) -> dict:
    """Present pages of the restored tree's pages-*.img mappings: written (anonymous) and mapped from
    the file, and the 64 KiB blocks of each mapping they fall in."""
    written = mapped = 0
    per_block: dict[tuple[int, int, int], int] = {}
    for pid, vma, _, page, _, w in image_pages_present(root):
        written += w
        mapped += not w
        per_block[(pid, vma, page >> 4)] = per_block.get((pid, vma, page >> 4), 0) + 1
    return {"written_bytes": written * 4096, "mapped_from_file_bytes": mapped * 4096, "blocks_64k": len(per_block),
            "full_blocks_64k": sum(1 for n in per_block.values() if n == 16)}


def snapshot(model: Path, work: Path, restores: int) -> dict:
    """Checkpoint the model, then restore it ``restores`` times with the page cache dropped."""
    snap = work / "snap"
    shutil.rmtree(snap, ignore_errors=True)
    subprocess.run([*CLI, "checkpoint", str(model), "--out", str(snap)], check=True, capture_output=True)
    row = {"pages_bytes": sum(f.stat().st_size for f in (snap / "criu").glob("pages-*.img")),
           "pages_mapped_bytes": [], "at_ready": []}
    for i in range(restores):
        drop_caches()
        tl = work / f"timeline-{i}.jsonl"
        tl.unlink(missing_ok=True)
        summ, _ = restore_live(snap, ["--timeline-out", str(tl)], timeout=600)
        mapped = next((json.loads(x).get("attrs", {}).get("pages_mapped_bytes") for x in tl.read_text().splitlines()
                       if json.loads(x)["name"] == "FIRST_TOKEN"), None) if tl.exists() else None
        row["pages_mapped_bytes"].append(mapped)
        if summ.get("pid"):
            row["at_ready"].append(image_pages(int(summ["pid"])))
            kill_restored(int(summ["pid"]))
        time.sleep(1.0)
    shutil.rmtree(snap, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/coldstart-dietfloor"))
    ap.add_argument("--restores", type=int, default=3, help="restores of the checkpoint (the first records the profile)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    rows = [{"kind": "bare-import", **bare_import(m)} for m in ("torch", "vllm.entrypoints.openai.api_server")]
    rows.append({"kind": "live-server", "model": a.model.name, **live(a.model, a.work)})
    rows.append({"kind": "snapshot", "model": a.model.name, **snapshot(a.model, a.work, a.restores)})
    with open(a.out, "w") as out:
        for r in rows:
            print(json.dumps(r), flush=True)
            out.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
