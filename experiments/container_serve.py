"""Serving speed in containers: a restored container against a stock vLLM container, and the
restored server reached directly (the server restored into the container's network, its port the
container's) against through the private network's forwarder (a snapshot checkpointed on loopback).

    PYTHONPATH=toolkit .venv/bin/python experiments/container_serve.py SIZE ROUNDS OUT_DIR [SERVERS [PATHS]]
    PYTHONPATH=toolkit .venv/bin/python experiments/container_serve.py --render OUT_DIR

Three containers of the app image built from this tree, up side by side: ``stock`` (vLLM's own
server and CPU worker, `--enforce-eager` and the same KV cache as ours), ``direct`` (`coldstart
container checkpoint` as shipped: `--listen 0.0.0.0`) and ``relay`` (the same checkpoint with
`--listen 127.0.0.1`: the entrypoint restores it into a private network namespace and forwards port
8000 to it). The restored ones are measured once their weights have settled into anonymous memory.
Each round, in rotating order, vLLM's serving benchmark (bench.serve.vllm_bench: random prompts of
64 tokens, 64 output tokens; concurrency 1 with 16 prompts, 8 with 32) against each server by two
paths: ``ip`` (the container's address on the bridge, as a pod IP) and ``port`` (the port published
on the host's loopback: docker-proxy, dockerd runs without iptables here). Rows go to
OUT_DIR/raw.jsonl; OUT_DIR/table.md is rendered from them. SERVERS and PATHS (comma-separated) run a
subset (default stock,direct,relay and ip,port). Needs root and our dockerd."""
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from coldstart.bench.containers import snapshot_in_container
from coldstart.bench.serve import _greedy, _served_name, vllm_bench
from coldstart.containers import docker_api, image, run
from coldstart.engine.launcher import free_port

SETTLE = ("import json; from coldstart.bench.serve import _settled; "
          "print(json.dumps(_settled('http://127.0.0.1:8000')))")
CONC = {1: 16, 8: 32}


def wait_ready(ctr, restored: bool, timeout: float = 1800) -> None:
    """Until the restore's ready file exists (its canary passed; loopback reaches the server before
    that), or the stock server answers."""
    check = "test -f /run/coldstart/ready.json" if restored else "curl -fsS -m 2 http://127.0.0.1:8000/v1/models"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ctr.reload()
        if ctr.status != "running":
            raise RuntimeError(f"{ctr.name} stopped: {ctr.logs().decode(errors='replace')[-1500:]}")
        if ctr.exec_run(["sh", "-c", check]).exit_code == 0:
            return
        time.sleep(1)
    raise RuntimeError(f"{ctr.name} not ready in {timeout:.0f} s")


def main() -> None:
    size, rounds, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    servers = sys.argv[4].split(",") if len(sys.argv) > 4 else ["stock", "direct", "relay"]
    paths = sys.argv[5].split(",") if len(sys.argv) > 5 else ["ip", "port"]
    out.mkdir(parents=True, exist_ok=True)
    raw = (out / "raw.jsonl").open("a")

    def emit(row: dict) -> None:
        raw.write(json.dumps(row) + "\n")
        raw.flush()
        print(json.dumps(row), flush=True)

    c = docker_api.client(None)
    tag = image.app_image(c, Path(__file__).resolve().parents[1], say=print).tag
    work = Path("/var/tmp/coldstart-serve-container")
    model, direct = snapshot_in_container(c, tag, size, work)
    relay = direct.with_name(direct.name + "-loopback")
    if not (relay / "manifest.json").exists():
        res = run.checkpoint(c, tag, model, relay, extra=["--layout", "hot", "--listen", "127.0.0.1"])
        if res.exit_code != 0:
            raise RuntimeError(res.logs[-2000:])
    emit({"image": tag, "size": size, "direct": str(direct), "relay": str(relay),
          "host": subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo; nproc; uname -r"],
                                 capture_output=True, text=True).stdout.split("\n")[:3]})
    ctrs, urls = {}, {}
    try:
        for name in servers:
            port = free_port()
            if name == "stock":
                ctrs[name] = run.create_naive(c, tag, model, port, extra=["--enforce-eager"])
                ctrs[name].start()
            else:
                ctrs[name] = run.start_restore(c, tag, direct if name == "direct" else relay, model, port)
            wait_ready(ctrs[name], name != "stock")
            ctrs[name].reload()
            ip = ctrs[name].attrs["NetworkSettings"]["Networks"][docker_api.NETWORK]["IPAddress"]
            urls[name] = {"ip": f"http://{ip}:8000", "port": f"http://127.0.0.1:{port}"}
            info = {"server": name, "urls": urls[name]}
            if name != "stock":
                r = ctrs[name].exec_run(["python", "-c", SETTLE])
                info["settle"] = json.loads(r.output.decode().strip().splitlines()[-1])
                summary = next(ln for ln in ctrs[name].logs().decode(errors="replace").splitlines()
                               if ln.startswith('{"url"'))
                s = json.loads(summary)
                info["restored"], info["net"] = s["restored"], s["attrs"].get("RESTORE_ISSUED", {}).get("net")
            info["greedy"] = _greedy(urls[name]["ip"])
            emit(info)
        names = list(ctrs)
        for rnd in range(rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for name in order:
                for path in paths:
                    u = urls[name][path]
                    for conc, prompts in CONC.items():
                        f = out / "runs" / f"{rnd}-{name}-{path}-c{conc}.json"
                        f.parent.mkdir(exist_ok=True)
                        f.unlink(missing_ok=True)
                        r = vllm_bench(u, _served_name(u), model, conc, prompts, 64, 64, f)
                        emit({"round": rnd, "server": name, "path": path, "concurrency": conc,
                              **{k: r.get(k) for k in ("completed", "output_throughput", "median_tpot_ms",
                                                       "mean_ttft_ms")}})
    finally:
        for ctr in ctrs.values():
            ctr.remove(force=True)
    raw.close()
    render(out)


def render(out: Path) -> None:
    rows = [json.loads(ln) for ln in (out / "raw.jsonl").read_text().splitlines()]
    runs = [r for r in rows if "round" in r]
    greedy = {r["server"]: r["greedy"] for r in rows if "greedy" in r}
    have = [s for s in ("stock", "direct", "relay") if any(r["server"] == s for r in runs)]
    pairs = [(a, b) for a, b in (("direct", "stock"), ("relay", "stock"), ("direct", "relay")) if a in have and b in have]
    L = ["| path | concurrency | " + " | ".join(f"{s} tok/s" for s in have) + " | "
         + " | ".join(f"{a} / {b} (per round)" for a, b in pairs) + " | median TPOT ms " + " / ".join(have) + " |",
         "|---|---|" + "---|" * (len(have) + len(pairs) + 1)]
    for path in dict.fromkeys(r["path"] for r in runs):
        for conc in CONC:
            got = {s: {r["round"]: r for r in runs if (r["server"], r["path"], r["concurrency"]) == (s, path, conc)}
                   for s in have}
            tps = {s: {k: v["output_throughput"] for k, v in d.items()} for s, d in got.items()}
            med = {s: statistics.median(v.values()) for s, v in tps.items() if v}
            tpot = {s: statistics.median(v["median_tpot_ms"] for v in d.values()) for s, d in got.items() if d}
            cells = []
            for a, b in pairs:
                ratio = [tps[a][k] / tps[b][k] for k in sorted(tps[b]) if k in tps[a]]
                cells.append(f"**{statistics.median(ratio):.3f}x** (" + ", ".join(f"{x:.3f}" for x in ratio) + ")")
            L.append(f"| {path} | {conc} | " + " | ".join(f"{med[s]:.1f}" for s in have) + " | " + " | ".join(cells)
                     + " | " + " / ".join(f"{tpot[s]:.1f}" for s in have) + " |")
    if "stock" in greedy:
        L += ["", "Greedy answers (4 prompts x 32 tokens) identical to the stock container's: " + ", ".join(
            f"{s} {'yes' if greedy[s] == greedy['stock'] else 'NO'}" for s in greedy if s != "stock") + "."]
    elif len(greedy) > 1:
        L += ["", "Greedy answers (4 prompts x 32 tokens) identical across the servers: "
              + ("yes" if len({json.dumps(g) for g in greedy.values()}) == 1 else "NO") + "."]
    (out / "table.md").write_text("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--render"]:
        render(Path(sys.argv[2]))
    else:
        main()
