"""``coldstart bench lazy``: restore → first token on an emulated fresh node, the snapshot in a
registry behind a shaped link (registry.link: 1 or 10 Gbit/s), by

- ``pull``: `coldstart pull REF DIR`, then `coldstart restore DIR` (everything crosses first);
- ``lazy``: `coldstart restore REF` with the mount's prefetch off (chunks on first read only);
- ``lazy+prefetch``: the same with the restore's default prefetch: the chunks the access profile
  names, in first-access order, the rest from the first token on;
- ``lazy+prefetch-all`` (only when asked for): every chunk in first-access order from the mount on;
- ``lazy+prefetch-raw`` (only when asked for): lazy + prefetch of the same trees pushed with
  ``--compress none`` (every chunk as is: what the link carried before compression);
- ``nydus``: the same tree as a RAFS image in the same registry, mounted by nydusd (its bootstrap
  fetched first, prefetch of the profile's files in first-access order, then the rest), then
  `coldstart restore MOUNT` (registry.nydus; skipped with a note when nydus is not built);
- ``local``: `coldstart restore DIR` of a local copy, page cache warm (the floor).

Each start is timed from the spawn of the first command to its summary line (printed after the
canary passed), with the node emptied before it: the chunk cache, the node's verification records
and profiles (a new COLDSTART_NODE_DIR), and the page cache. ``local`` is the steady state of a
node that has the snapshot (restored once before, not measured). The snapshot is pushed with the
access profile its checkpoint node recorded (the bench restores it once locally first), so the
packs are in first-access order. Bytes that crossed the link before the
first token are read from the node side of the veth. What the snapshot alone needs is bounded by
bytes ÷ link rate: the table sets each method against that.

With ``--container`` (``models``), each of those starts is `coldstart container restore TARGET` of a
snapshot checkpointed in a container of the app image (container_cases): the fleet path, artifact to
container through the lazy registry, timed from the same spawn.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

Say = Callable[[str], None]
METHODS = ("pull", "lazy", "lazy+prefetch", "nydus", "local")
EXTRA_METHODS = ("lazy+prefetch-all", "lazy+prefetch-raw")  # measured only when asked for (--methods)
EXTRA_WHAT = {
    "lazy+prefetch-all": "the mount prefetching every chunk in first-access order from the start, as before the "
                         "restore's default became the profiled chunks first and the rest from the first token on",
    "lazy+prefetch-raw": "lazy + prefetch of the snapshot (and runtime) pushed with `--compress none`: every chunk "
                         "as is, as before chunks were stored as zstd frames",
}


def _rx(dev: str) -> int:
    return int(Path(f"/sys/class/net/{dev}/statistics/rx_bytes").read_text())


def _coldstart(*args: str) -> list[str]:
    return [sys.executable, "-m", "coldstart", *args]


def _stop(summ: dict, mountpoints: list[Path]) -> None:
    """End the restored server's PID namespace, then unmount (the server maps files of the mount)."""
    from coldstart.bench.pipeline import kill_restored

    if int(summ.get("pid") or 0) > 0:
        kill_restored(int(summ["pid"]))
    for mp in mountpoints:
        subprocess.run(["fusermount3", "-u", "-z", str(mp)], capture_output=True)


def record_profile(snap: Path) -> None:
    """One restore of ``snap`` as its own process, in this node's default state dir, so that the node
    records its access profile (which push then ships). A process of its own: the recording's
    threads and files stay out of this one (an in-process restore here left the next checkpoint's
    server short of file descriptors)."""
    from coldstart.bench.pipeline import kill_restored

    p = subprocess.run(_coldstart("restore", str(snap), "--no-serve", "--no-fallback", "--warm-record", "force"),
                       capture_output=True, text=True, timeout=900)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith('{"url"')]
    if lines and int(json.loads(lines[-1]).get("pid") or 0) > 0:
        kill_restored(int(json.loads(lines[-1])["pid"]))
    if p.returncode != 0:
        raise RuntimeError(f"restore of {snap} to record its profile failed: {p.stderr.strip()[-300:]}")


def _stop_container(summ: dict) -> None:
    """Remove the container a `coldstart container restore` started, then unmount the lazy mounts
    made for restore containers that are gone (the product's own clean-up, run.gc_container_mounts)."""
    from coldstart.containers import docker_api, run

    c = docker_api.client(None)
    if summ.get("container"):
        try:
            c.containers.get(summ["container"]).remove(force=True)
        except Exception:  # noqa: BLE001 - gone already
            pass
    run.gc_container_mounts(c)


def one_start(method: str, ref: str, local: Path, work: Path, dev: str | None, env: dict,
              nydus_boot: str = "", runtime_ref: str = "", model: Path | None = None) -> dict:
    """One start on an emptied node; returns the row (seconds from spawn to first token, bytes over
    the link before it, the restore's own events). ``runtime_ref``: the node has no runtime either:
    ``pull`` pulls it too and restores with it, the lazy methods mount it lazily (nydus and local
    keep the node's own). ``model``: the start is `coldstart container restore TARGET --model MODEL`
    (the snapshot made in a container of the app image; the node dir, the lazy mount and the host's
    warming as that command makes them), the container removed after its first token."""
    from coldstart.warm.residency import drop_caches

    # local: the steady state of a node that has this snapshot (verified before, profile recorded)
    node = work / ("node-local" if method == "local" else "node")
    if method != "local":
        shutil.rmtree(node, ignore_errors=True)
    shutil.rmtree(work / "lazy-cache", ignore_errors=True)
    shutil.rmtree(work / "pulled", ignore_errors=True)
    shutil.rmtree(work / "pulled-runtime", ignore_errors=True)
    shutil.rmtree(work / "nydus-node", ignore_errors=True)
    env = {**env, "COLDSTART_NODE_DIR": str(node), "COLDSTART_LAZY_CACHE": str(work / "lazy-cache"),
           "COLDSTART_LAZY_PREFETCH": {"lazy": "none", "lazy+prefetch-all": "all"}.get(method, "")}
    if method != "local":
        drop_caches()
    rx0 = _rx(dev) if dev else 0
    row: dict = {"method": method}
    t0 = time.monotonic()
    env["COLDSTART_T0"] = repr(time.time())  # the restore's timeline counts from here
    nmount = None
    try:
        if method == "nydus":
            from coldstart.registry import nydus

            nmount = nydus.mount(ref, nydus_boot, work / "nydus-mnt", work / "nydus-node")
            row["mount_s"] = round(time.monotonic() - t0, 3)
            target = str(nmount.mountpoint)
        elif method == "pull":
            p = subprocess.run(_coldstart("pull", ref, str(work / "pulled")), env=env, capture_output=True,
                               text=True, timeout=1800)
            if p.returncode != 0:
                raise RuntimeError(f"pull failed: {p.stderr.strip()[-300:]}")
            if runtime_ref:
                p = subprocess.run(_coldstart("pull", runtime_ref, str(work / "pulled-runtime")), env=env,
                                   capture_output=True, text=True, timeout=3600)
                if p.returncode != 0:
                    raise RuntimeError(f"pull of the runtime failed: {p.stderr.strip()[-300:]}")
            row["pull_s"] = round(time.monotonic() - t0, 3)
            target = str(work / "pulled")
        else:
            target = ref if method.startswith("lazy") else str(local)
        # after a pull every chunk was checked against the index (as a mount checks each on read):
        # the restore's own hashing would count twice; nydusd is given the same terms
        extra = ["--verify", "off"] if method in ("pull", "nydus") else []
        if runtime_ref and method.startswith("lazy"):
            extra += ["--runtime", runtime_ref]
        elif runtime_ref and method == "pull":
            extra += ["--runtime", str(work / "pulled-runtime")]
        if model is not None:
            from coldstart.engine.launcher import free_port

            argv = _coldstart("container", "restore", target, "--model", str(model), "--port", str(free_port()),
                              *extra)
        else:
            argv = _coldstart("restore", target, "--no-serve", "--no-fallback", *extra)
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        row["link_bytes"] = (_rx(dev) - rx0) if dev else None  # (a little after the first token)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith('{"url"' if model is None else '{"container"')]
        summ = json.loads(lines[-1]) if lines else {}
        from coldstart.state import state_dir

        if model is not None:
            _stop_container(summ)
        else:
            _stop(summ, list((state_dir() / "mounts").glob("*")) if method.startswith("lazy") else [])
        if not summ:
            raise RuntimeError(f"restore exited {p.returncode}: {p.stderr.strip()[-300:]}")
        if model is not None and not summ.get("restored"):  # (the container's cold boot serves instead)
            raise RuntimeError(f"the container fell back: {summ.get('fallback_reason')}")
        # the restore's clock starts at COLDSTART_T0, set just before the first spawn
        row["first_token_s"] = summ["events"].get("FIRST_TOKEN")
        row["restored"] = summ.get("restored")
        row["events"] = summ.get("events")
    except Exception as e:  # noqa: BLE001 - recorded; the next cell still runs
        row["error"] = f"{type(e).__name__}: {e}"
    finally:
        if nmount is not None:
            nmount.unmount()
    return row


def container_cases(sizes: str, layouts: str, work: Path, say: Say) -> tuple[list[tuple[str, Path]], dict[str, Path]]:
    """For ``--container``: (case label, snapshot dir) per model and layout, each checkpointed in a
    container of the app image built from this checkout (bench.containers.bench_case), with the access
    profile this node recorded at the snapshot's first container restore (the push ships it and packs
    in its order); and label -> model dir."""
    from coldstart.bench.containers import bench_case, case_label, new_to_node, one_start as container_start
    from coldstart.warm.snapshot import node_profile

    cases, models = [], {}
    for size in [s.strip() for s in sizes.split(",") if s.strip()]:
        for layout in [x.strip() for x in layouts.split(",") if x.strip()]:
            bc = bench_case(size, work, say, layout)
            label = case_label(size, layout)
            prof = node_profile(bc.snap)
            if prof is None or not prof.exists():
                say(f"restoring {label} once in a container, to record its access profile (the push packs in that order)")
                new_to_node(bc.snap)
                row = container_start(bc.client, bc.image, "restore", bc.model, bc.snap, bc.layers)
                prof = node_profile(bc.snap)
                if row.get("error") or prof is None or not prof.exists():
                    raise RuntimeError(f"the first container restore of {label} recorded no access profile: "
                                       f"{row.get('error') or 'none written'}")
            cases.append((label, bc.snap))
            models[label] = bc.model
    return cases, models


def _nydus_image(snap: Path, ref: str, out: Path, rows: list[dict], size: str, rate: float, say: Say) -> str:
    """Build (once) and push the snapshot's RAFS image; returns the bootstrap's digest."""
    from coldstart.registry import artifact, nydus

    t0 = time.monotonic()
    img = nydus.build(snap, out, artifact.profile_files(snap))
    built = time.monotonic() - t0
    nydus.push(img, ref)
    rows.append({"size": size, "rate_gbit": rate, "method": "nydus-image", "blob_bytes": img.blob.stat().st_size,
                 "bootstrap_bytes": img.bootstrap.stat().st_size, "build_s": round(built, 3),
                 "push_s": round(time.monotonic() - t0 - built, 3)})
    say(json.dumps(rows[-1]))
    return img.bootstrap_digest


def _artifact_sizes(ref: str) -> dict:
    """The pushed artifact's sizes, from its index: packs (what the registry stores), files, and the
    profiled chunks (what a lazy restore prefetches first), stored and as the files' bytes."""
    from coldstart.registry import artifact
    from coldstart.registry.distribution import Ref, Registry

    index, _, _ = artifact.fetch_index(Registry(Ref.parse(ref)))
    first = index.chunks[:index.profiled]
    return {"bytes": index.bytes, "file_bytes": sum(e.size for e in index.entries), "chunks": len(index.chunks),
            "packs": len(index.packs), "profiled_bytes": sum(c.stored for c in first),
            "profiled_file_bytes": sum(c.size for c in first)}


def run_bench(cases: list[tuple[str, Path]], rates: list[float], reps: int, work: Path, say: Say,
              methods: tuple[str, ...] = METHODS, runtime: Path | None = None,
              models: dict[str, Path] | None = None) -> list[dict]:
    """``cases``: (size, local snapshot dir). One registry per rate, in its own namespace behind the
    shaped link; every snapshot pushed once per registry (its storage is kept between rates).
    ``runtime``: the venv the snapshots' servers run from, pushed too (`push --runtime-of`): the
    emulated node then has neither the snapshot nor the runtime (see one_start). ``models``: size ->
    model dir: every start is a `coldstart container restore` (the snapshots made in containers)."""
    from coldstart.registry import artifact, link, server
    from coldstart.registry.cli import runtime_ranges_of

    rows: list[dict] = []
    store = work / "registry"
    for rate in rates:
        with link.make_link(rate) as L:
            srv = server.start(store, 5000, host=L.addr, netns=L.netns)
            try:
                for size, snap in cases:
                    model = (models or {}).get(size)  # (None: a host restore)
                    if "local" in methods:  # not measured: the local node's first restore (verify, profile)
                        rows.append({"size": size, "rate_gbit": rate,
                                     **one_start("local", "", snap, work / "node-state", None, dict(os.environ),
                                                 model=model),
                                     "method": "local-first"})
                    refs: dict[str, tuple[str, str]] = {}  # compression -> (snapshot ref, runtime ref)
                    for comp in ("zstd", "none") if "lazy+prefetch-raw" in methods else ("zstd",):
                        tag = "" if comp == "zstd" else "-raw"
                        ref = f"http://{L.addr}:5000/snapshots/{size}{tag}:bench"
                        pr = artifact.push(snap, ref, compress=comp)
                        rows.append({"size": size, "rate_gbit": rate, "method": "artifact" + tag, "compress": comp,
                                     **_artifact_sizes(ref), "push_s": pr.seconds})
                        say(json.dumps(rows[-1]))
                        rt_ref = ""
                        if runtime is not None:
                            rt_ref = f"http://{L.addr}:5000/runtimes/{size}{tag}:bench"
                            pr = artifact.push_runtime(runtime, rt_ref, runtime_ranges_of(runtime, snap), compress=comp)
                            rows.append({"size": size, "rate_gbit": rate, "method": "runtime-artifact" + tag,
                                         "compress": comp, **_artifact_sizes(rt_ref), "push_s": pr.seconds,
                                         "uploaded_bytes": pr.uploaded_bytes})
                            say(json.dumps(rows[-1]))
                        refs[comp] = (ref, rt_ref)
                    ref, rt_ref = refs["zstd"]
                    boot = ""
                    if "nydus" in methods:
                        boot = _nydus_image(snap, ref, work / "nydus-images" / size, rows, size, rate, say)
                    for rep in range(reps):
                        for method in (methods if rep % 2 == 0 else methods[::-1]):
                            if method == "local":  # its page cache as a node that has the snapshot keeps it:
                                # another method may just have dropped it (one unmeasured start fills it)
                                one_start("local", ref, snap, work / "node-state", None, dict(os.environ),
                                          model=model)
                            r_ref, r_rt = refs["none" if method.endswith("-raw") else "zstd"]
                            row = {"size": size, "rate_gbit": rate, "rep": rep,
                                   **one_start(method, r_ref, snap, work / "node-state", L.node_if,
                                               dict(os.environ), boot, r_rt, model=model)}
                            rows.append(row)
                            say(json.dumps({k: v for k, v in row.items() if k != "events"}))
            finally:
                srv.stop()
    return rows


CONTAINER_NOTE = ("Every start here is `coldstart container restore TARGET --model MODEL` (TARGET: the registry "
                  "reference, the pulled directory, or the local copy) of a snapshot checkpointed in a container of "
                  "the app image, timed from the spawn of `coldstart pull` or of that command (its caller's clock, "
                  "COLDSTART_T0, passed into the container) to the first token its entrypoint reports; the host warms "
                  "the snapshot from the create call, through the lazy mount for a reference; the container is "
                  "removed after it. The node dir (verification records, profiles) is the container's as well.")


def render(rows: list[dict], host: str, command: str, container: bool = False) -> str:
    import statistics

    def med(sel: list[dict], key: str = "first_token_s"):
        v = [r[key] for r in sel if r.get(key) is not None]
        return statistics.median(v) if v else None

    fmt = lambda x, d=2: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    L = ["# Restore → first token on an emulated fresh node (snapshot in a registry behind a shaped link)"
         + (", in containers" if container else ""), "",
         f"`{command}`", "", host, "", *([CONTAINER_NOTE, ""] if container else []),
         "First token counted from the spawn of the first command (pull or restore); node emptied before "
         "each start (chunk cache, verification records, profiles, page cache) except `local` (warm page cache). "
         "Medians; link bytes = bytes received on the node's side of the veth before the first token. nydusd: "
         "nydus-rs 2.2.0, RAFS v6, zstd as ours, 1 MiB chunks, prefetch of the profile's files first then all, "
         "no chunk digest check on read (v6 has none; our mount checks every chunk); its bootstrap fetch and "
         "mount are inside its time.", "",
         "| model | link | artifact (MiB) | pull then restore (s) | lazy (s) | lazy + prefetch (s) | nydusd (s) "
         "| local warm (s) | link MiB before first token: pull / lazy / lazy+prefetch / nydusd | bound (s) "
         "| lazy+prefetch / bound | pull / lazy+prefetch | nydusd / lazy+prefetch |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    every = METHODS + EXTRA_METHODS
    extra = [m for m in EXTRA_METHODS if any(r["method"] == m and r.get("rep") is not None for r in rows)]
    for size in dict.fromkeys(r["size"] for r in rows):
        for rate in dict.fromkeys(r["rate_gbit"] for r in rows if r["size"] == size):
            sel = lambda m: [r for r in rows if r["size"] == size and r["rate_gbit"] == rate and r["method"] == m  # noqa: E731
                             and (r.get("rep") is not None or m in ("artifact", "runtime-artifact"))]
            art = next(iter(sel("artifact")), {})
            t = {m: med(sel(m)) for m in every}
            b = {m: med(sel(m), "link_bytes") for m in every}
            # what a restore needs before its first token: at most what the lazy method that fetched
            # least before it fetched (without prefetch, the mount's readahead fetches more than the faults need)
            lazies = [b[m] for m in ("lazy", "lazy+prefetch", *EXTRA_METHODS) if b[m] is not None]
            need = min(lazies) if lazies else None
            bound = max(t["local"] or 0, (need or 0) * 8 / (rate * 1e9)) if need is not None else None
            lp = t["lazy+prefetch"]
            L.append(f"| {size} | {rate:g} Gbit/s | {fmt(art.get('bytes', 0) / 2**20, 0)} | {fmt(t['pull'])} | "
                     f"{fmt(t['lazy'])} | {fmt(lp)} | {fmt(t['nydus'])} | {fmt(t['local'])} | "
                     + " / ".join(fmt((b[m] or 0) / 2**20, 0) if b[m] is not None else "-"
                                  for m in ("pull", "lazy", "lazy+prefetch", "nydus"))
                     + f" | {fmt(bound)} | " + (f"**{lp / bound:.2f}x**" if lp and bound else "-")
                     + " | " + (f"**{t['pull'] / lp:.1f}x**" if lp and t["pull"] else "-")
                     + " | " + (f"**{t['nydus'] / lp:.2f}x**" if lp and t["nydus"] else "-") + " |")
    for m in extra:
        L += ["", f"`{m}` ({EXTRA_WHAT[m]}):", "",
              "| model | link | first token (s) | link MiB before first token | vs lazy + prefetch |", "|---|---|---|---|---|"]
        for size in dict.fromkeys(r["size"] for r in rows):
            for rate in dict.fromkeys(r["rate_gbit"] for r in rows if r["size"] == size):
                cell = [r for r in rows if r["size"] == size and r["rate_gbit"] == rate and r.get("rep") is not None]
                mine = [r for r in cell if r["method"] == m]
                ta, tp = med(mine), med([r for r in cell if r["method"] == "lazy+prefetch"])
                ba = med(mine, "link_bytes")
                L.append(f"| {size} | {rate:g} Gbit/s | {fmt(ta)} | {fmt((ba or 0) / 2**20, 0) if ba else '-'} | "
                         + (f"{ta / tp:.2f}x" if ta and tp else "-") + " |")
    L += ["", "bound = max(local warm, bytes needed before the first token ÷ link rate); bytes needed = the least "
          "any lazy method fetched before its first token."]
    arts = [r for r in rows if r["method"].startswith(("artifact", "runtime-artifact")) and r.get("file_bytes")]
    if arts:
        L += ["", "Artifacts as pushed (one push per link; the first shown): the files' bytes, the packs' bytes (what "
              "the registry stores and a pull fetches), and the profiled chunks' (what a lazy restore fetches first).",
              "", "| model | artifact | compression | files (MiB) | packs (MiB) | packs / files | profiled chunks, "
              "stored (MiB) | profiled chunks, files' bytes (MiB) |", "|---|---|---|---|---|---|---|---|"]
        seen: set = set()
        for r in arts:
            k = (r["size"], r["method"])
            if k in seen:
                continue
            seen.add(k)
            L.append(f"| {r['size']} | {'runtime' if r['method'].startswith('runtime') else 'snapshot'} | "
                     f"{r.get('compress', 'zstd')} | {r['file_bytes'] / 2**20:.0f} | {r['bytes'] / 2**20:.0f} | "
                     f"{r['bytes'] / r['file_bytes']:.2f} | {r['profiled_bytes'] / 2**20:.0f} | "
                     f"{r.get('profiled_file_bytes', r['profiled_bytes']) / 2**20:.0f} |")
    rts = {(r["size"], r["rate_gbit"]): r for r in rows if r["method"] == "runtime-artifact"}
    if rts:
        r = next(iter(rts.values()))
        L += ["", f"The node has no runtime either: the venv the servers run from ({r['bytes'] / 2**20:.0f} MiB, "
              f"{r['chunks']} chunks) is in the registry too (`coldstart push VENV REF --runtime-of SNAP`: "
              "first the chunks the snapshot's profile names the server mapping, "
              + ", ".join(f"{s} {v['profiled_bytes'] / 2**20:.0f} MiB" for (s, _), v in rts.items() if _ == r["rate_gbit"])
              + "). `pull` pulls all of it before the restore; the lazy methods mount it (`restore --runtime REF`; "
              "prefetch of the profiled chunks only, with lazy + prefetch); nydusd and local use the node's own "
              "venv. The link bytes include the runtime's."]
    errs = [r for r in rows if r.get("error")]
    if errs:
        L += ["", "Errors:"] + [f"- {r['size']} {r['rate_gbit']:g} Gbit/s {r['method']} rep {r.get('rep')}: "
                               f"{r['error'][:240]}" for r in errs]
    return "\n".join(L) + "\n"
