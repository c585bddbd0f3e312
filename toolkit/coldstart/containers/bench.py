"""``coldstart bench container``: container restore vs a naive container start of the same model, both
timed from the docker-py create call to the first completion answered through the host's port.

Naive: the runtime image running vLLM's OpenAI server as a user would (docker's default security,
1 GiB /dev/shm). Restore: the image's entrypoint restoring a snapshot that was checkpointed in a
container, mounted read-only. Cold cells drop the page cache first (the snapshot, the venv, the
model); cases are interleaved per repetition.
"""
from __future__ import annotations

import json
import socket
import statistics
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

Say = Callable[[str], None]


def wait_port_closed(port: int, timeout: float = 60.0) -> None:
    """Until nothing listens on 127.0.0.1:``port`` (the previous server must be gone: else a restore
    finds its port busy and takes a private network)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"port {port} still in use after {timeout:.0f} s")


def _first_completion(port: int, model: str, deadline: float, ctr) -> float:
    """Poll a 1-token completion until it answers; returns the monotonic time it did."""
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 1,
                       "temperature": 0}).encode()
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                if r.status == 200:
                    return time.monotonic()
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        ctr.reload()
        if ctr.status not in ("created", "running"):
            raise RuntimeError(f"container {ctr.status}: {ctr.logs().decode(errors='replace')[-500:]}")
        time.sleep(0.05)
    raise RuntimeError("no first token before the deadline")


def _summary(ctr, deadline: float) -> dict:
    """The entrypoint's one-line JSON summary ({"url", "restored", "fallback_reason", ...})."""
    while time.monotonic() < deadline:
        logs = ctr.logs().decode(errors="replace")
        line = next((ln for ln in logs.splitlines() if ln.startswith('{"url"')), None)
        if line:
            return json.loads(line)
        time.sleep(0.1)
    return {}


def naive(c, image: str, model: Path, port: int, kv_cache_bytes: int = 256 << 20):
    return c.containers.run(image, ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                                    "--host", "127.0.0.1", "--port", str(port), "--seed", "0",
                                    "--kv-cache-memory-bytes", str(kv_cache_bytes)],
                            entrypoint=["python3"], detach=True, network_mode="host", shm_size="1g",
                            volumes={str(model): {"bind": str(model), "mode": "ro"}})


def run_bench(c, image: str, cases: list[tuple[str, Path, Path]], *, reps: int, caches: tuple[str, ...],
              say: Say = print) -> list[dict]:
    """``cases``: (size name, model dir, snapshot dir). One record per (size, method, cache, rep)."""
    from coldstart.containers import run
    from coldstart.criu.bench import drop_caches

    rows: list[dict] = []
    for rep in range(reps):
        for size, model, snap in cases:
            port = json.loads((snap / "manifest.json").read_text())["port"]
            for cache in caches:
                methods = ["restore", "naive"] if rep % 2 == 0 else ["naive", "restore"]
                for method in methods:
                    wait_port_closed(port)
                    if cache == "cold":
                        drop_caches()
                    t0 = time.monotonic()
                    ctr = (run.start_restore(c, image, snap, model) if method == "restore"
                           else naive(c, image, model, port))
                    row = {"size": size, "method": method, "cache": cache, "rep": rep}
                    try:
                        t1 = _first_completion(port, str(model), t0 + 900, ctr)
                        row["first_token_s"] = round(t1 - t0, 3)
                        if method == "restore":  # its summary line follows the first token
                            summ = _summary(ctr, time.monotonic() + 60)
                            row["restored"] = summ.get("restored")
                            row["fallback_reason"] = summ.get("fallback_reason")
                    except Exception as e:  # noqa: BLE001 - recorded; the next cell still runs
                        row["error"] = f"{type(e).__name__}: {e}"
                    finally:
                        ctr.remove(force=True)
                    rows.append(row)
                    say(json.dumps(row))
    return rows


def render(rows: list[dict], host: str, command: str) -> str:
    L = ["# Container restore vs naive container start (first token, from the docker-py create call)", "",
         f"`{command}`", "", host, "",
         "| model | cache | naive median (s) | restore median (s) | restores that restored | speed-up |",
         "|---|---|---|---|---|---|"]
    for size in dict.fromkeys(r["size"] for r in rows):
        for cache in dict.fromkeys(r["cache"] for r in rows):
            nv = [r["first_token_s"] for r in rows if r["size"] == size and r["cache"] == cache
                  and r["method"] == "naive" and "first_token_s" in r]
            rs = [r for r in rows if r["size"] == size and r["cache"] == cache and r["method"] == "restore"]
            rv = [r["first_token_s"] for r in rs if "first_token_s" in r]
            ok = sum(1 for r in rs if r.get("restored"))
            if not nv or not rv:
                L.append(f"| {size} | {cache} | {statistics.median(nv) if nv else '-'} | "
                         f"{statistics.median(rv) if rv else '-'} | {ok}/{len(rs)} | - |")
                continue
            n, r = statistics.median(nv), statistics.median(rv)
            L.append(f"| {size} | {cache} | {n:.2f} ({len(nv)}) | {r:.2f} ({len(rv)}) | {ok}/{len(rs)} | **{n / r:.1f}x** |")
    errs = [r for r in rows if r.get("error")]
    if errs:
        L += ["", "Errors:"] + [f"- {r['size']} {r['method']} {r['cache']} rep {r['rep']}: {r['error'][:200]}" for r in errs]
    return "\n".join(L) + "\n"
