"""Cold reload in a live worker: map vs copy buffered vs copy O_DIRECT vs stock."""
import json, sys, time, random, shutil
from pathlib import Path
from coldstart.engine.launcher import EngineSpec, start_engine
from coldstart.pipeline.bench import _model, _free_port, _evict
from coldstart.weights.bench import resident_fraction
model = _model("bench"); work = Path("/var/tmp/cs-engcold"); shutil.rmtree(work, ignore_errors=True); work.mkdir()
spec = EngineSpec(model=model, run_dir=work / "run", port=_free_port(), sleep_mode=True)
eng = start_engine(spec)
try:
    eng.wait_ready(1800)
    c = spec.client(timeout=900)
    canary = c.complete("The capital of France is", max_tokens=8).token_ids
    flat = work / "flat"
    c.collective_rpc("coldstart_dump_weights", kwargs={"out_dir": str(flat)})
    ff = [flat / "weights.flat"]; st = sorted(model.glob("*.safetensors"))
    variants = {"map": dict(mode="map"), "copy-buf": dict(mode="copy", direct=False),
                "copy-odirect": dict(mode="copy", direct=True), "stock": None}
    res = {k: [] for k in variants}
    rng = random.Random(0)
    for rep in range(int(sys.argv[1])):
        order = list(variants); rng.shuffle(order)
        for k in order:
            files = st if k == "stock" else ff
            c.sleep(level=2); c.wake_up(["weights"]); _evict(files)
            r = resident_fraction(files)
            t = time.perf_counter()
            out = c.collective_rpc("reload_weights") if k == "stock" else c.collective_rpc("coldstart_reload", kwargs=dict(path=str(flat), **variants[k]))
            wall = time.perf_counter() - t
            c.wake_up(["kv_cache"])
            ok = c.complete("The capital of France is", max_tokens=8).token_ids == canary
            r0 = out[0] if out and isinstance(out[0], dict) else {}
            s = r0.get("seconds_rpc", wall)
            res[k].append(s)
            print(json.dumps({"rep": rep, "k": k, "s": round(s, 3), "wall": round(wall, 3), "resident": r, "ok": ok, "o_direct": r0.get("o_direct")}), flush=True)
    import statistics
    for k, v in res.items():
        print(k, "median", round(statistics.median(v), 3), [round(x, 3) for x in v])
finally:
    eng.stop() if hasattr(eng, "stop") else None
