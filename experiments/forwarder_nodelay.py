"""What the private network's forwarder costs a restore and its serving, with and without
TCP_NODELAY on the relayed sockets.

    PYTHONPATH=toolkit .venv/bin/python experiments/forwarder_nodelay.py SNAPSHOT MODEL_DIR ROUNDS OUT.jsonl

Each round, in turn order: the entrypoint (`coldstart restore SNAPSHOT`, serving, as its own process)
with --net host (clients reach the server directly), --net private (clients and the restore's own
checks go through netns.Forwarder), and --net private with TCP_NODELAY refused to the entrypoint's
sockets (the forwarder as it was before the option was set). Per variant: the restore's events, then
vLLM's serving benchmark (bench.serve.vllm_bench: 16 random prompts of 64 tokens, 64 output tokens,
concurrency 1 and 8) through the URL clients get. Needs root; the page cache warm."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from coldstart.bench.serve import vllm_bench

snap, model, rounds, out = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
NAGLE = ("import socket, sys\n"
         "_set = socket.socket.setsockopt\n"
         "def setsockopt(self, level, opt, *a):\n"
         "    if (level, opt) == (socket.IPPROTO_TCP, socket.TCP_NODELAY):\n"
         "        return None\n"
         "    return _set(self, level, opt, *a)\n"
         "socket.socket.setsockopt = setsockopt\n"
         "sys.argv = ['coldstart'] + sys.argv[1:]\n"
         "from coldstart.main import main\n"
         "sys.exit(main())\n")
VARIANTS = {"host": ["--net", "host"], "private": ["--net", "private"], "private-nagle": ["--net", "private"]}


def restore(variant: str):
    args = ["restore", str(snap), "--no-fallback", *VARIANTS[variant]]
    argv = ([sys.executable, "-c", NAGLE, *args] if variant == "private-nagle"
            else [str(Path(sys.executable).with_name("coldstart")), *args])
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    for line in p.stdout:
        if line.startswith('{"url"'):
            return p, json.loads(line)
    raise RuntimeError(f"{variant}: no summary line (exit {p.wait()})")


def stop(p) -> None:
    os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    time.sleep(2)


tmp = Path(tempfile.mkdtemp(prefix="fwd-"))
with out.open("a") as f:
    for r in range(rounds):
        names = list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]
        for v in names:
            p, s = restore(v)
            try:
                row = {"variant": v, "round": r, "restored": s["restored"], "events": s["events"]}
                for conc in (1, 8):
                    res = vllm_bench(s["url"], str(model), model, conc, 16, 64, 64, tmp / f"{v}-{r}-{conc}.json")
                    row[f"c{conc}"] = {k: res.get(k) for k in ("output_throughput", "median_ttft_ms", "median_tpot_ms",
                                                               "median_itl_ms", "p99_itl_ms")}
            finally:
                stop(p)
            f.write(json.dumps(row) + "\n")
            f.flush()
            e = row["events"]
            print(v, r, f"first token {e['FIRST_TOKEN'] - e['ENTRY_READY']:.3f} s after ENTRY_READY",
                  {c: round(row[c]["output_throughput"], 1) for c in ("c1", "c8")},
                  {c: round(row[c]["median_itl_ms"], 2) for c in ("c1", "c8")}, flush=True)
