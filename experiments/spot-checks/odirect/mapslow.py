"""After a cold map / cold copy / warm map reload: time 4 successive 8-token completions."""
import json, sys, time, shutil
from pathlib import Path
from coldstart.engine.launcher import EngineSpec, start_engine
from coldstart.pipeline.bench import _model, _free_port, _evict, _read
model = _model("bench"); work = Path("/var/tmp/cs-mapslow"); shutil.rmtree(work, ignore_errors=True); work.mkdir()
spec = EngineSpec(model=model, run_dir=work / "run", port=_free_port(), sleep_mode=True)
eng = start_engine(spec)
try:
    eng.wait_ready(1800)
    c = spec.client(timeout=900)
    canary = c.complete("The capital of France is", max_tokens=8).token_ids
    flat = work / "flat"
    c.collective_rpc("coldstart_dump_weights", kwargs={"out_dir": str(flat)})
    ff = [flat / "weights.flat"]
    for rep in range(2):
        for name, mode, cold in (("map-cold", "map", True), ("copy-cold", "copy", True), ("map-warm", "map", False)):
            c.sleep(level=2); c.wake_up(["weights"])
            _evict(ff) if cold else _read(ff)
            r = c.collective_rpc("coldstart_reload", kwargs=dict(path=str(flat), mode=mode))[0]
            c.wake_up(["kv_cache"])
            ts = []
            for i in range(4):
                t = time.perf_counter(); ok = c.complete("The capital of France is", max_tokens=8).token_ids == canary
                ts.append(round(time.perf_counter() - t, 3))
            print(json.dumps({"rep": rep, "case": name, "reload_s": r.get("seconds_rpc"), "completions_s": ts, "ok": ok}), flush=True)
finally:
    eng.stop()
