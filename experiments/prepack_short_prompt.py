"""Does a one-word prompt crash the engine whose linear layers serve from packed handles?

Usage: .venv/bin/python experiments/prepack_short_prompt.py MODEL_DIR SLEEP(0|1) PIDNS(0|1) PROMPT
(run once with COLDSTART_PREPACK=0 in the environment to compare). Prints OK and the completion, or
FAILED and the server's answer. On the Intel AMX host (2026-11-28) the tiny model with the prompt
"Hello" failed (EngineCore exited without a traceback) with prepack on, in every combination of
SLEEP and PIDNS tried, and answered with COLDSTART_PREPACK=0; "Hello there" and "The capital of
France is" answered with prepack on. vLLM's stock CPU worker (worker_cls="", no sleep mode) failed
the same way on "Hello". Root cause (same day, in-process with faulthandler): SIGILL in vLLM's
``cpu_attention_with_kv_cache``, which executes AMX instructions without asking Linux for the AMX
tile state (arch_prctl ARCH_REQ_XCOMP_PERM); oneDNN asks on its first AMX GEMM, so the order of
first kernels decided. Fixed in our worker by ``xstate.ask_amx()`` at its start; after the fix this script prints OK for "Hello"."""
import sys
import tempfile
from pathlib import Path

from coldstart.engine.launcher import EngineSpec, free_port, start_engine

model, sleep, pidns, prompt = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1", sys.argv[4]
spec = EngineSpec(model=model, run_dir=Path(tempfile.mkdtemp(prefix="cs-prepack-")), port=free_port(), sleep_mode=sleep)
eng = start_engine(spec, new_pidns=pidns)
try:
    eng.wait_ready(300)
    try:
        print("OK", repr(spec.client(timeout=120).complete(prompt, max_tokens=2).text))
    except Exception as e:  # noqa: BLE001 - the answer is the finding
        print("FAILED", str(e)[:200])
finally:
    eng.stop()
