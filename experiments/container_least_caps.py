"""The least capabilities a restore container needs: checkpoint the tiny model once in a container
with its server started without capabilities (``--server-caps none``), then restore that snapshot in
containers that each lack one capability of a starting set, without fallback, and record what
failed. CRIU's restore log is kept (a host directory at /run/coldstart instead of the tmpfs).

    PYTHONPATH=toolkit .venv/bin/python experiments/container_least_caps.py MODEL IMAGE WORKDIR [out.jsonl] [--round 2|3 [--dumped]]

Round 1 drops each capability of START (docker's defaults + SYS_ADMIN, SYS_PTRACE, NET_ADMIN, SYS_TIME)
from a snapshot checkpointed with START. Round 2 restores with only what round 1 found necessary
(MINIMAL) and without each of those, and checkpoints with MINIMAL + SETPCAP and/or SYS_PTRACE to find the
checkpoint's own needs (without SETPCAP the server cannot be started without capabilities).
Round 3 runs the product's checkpoint (containers.run.checkpoint: hot layout, the state tmpfs) with
the hot layout's set (run.CHECKPOINT_CAPS) and without each of them, notes the layout it published (a failed recording
keeps the dumped one) and restores each snapshot once in a restore container (run.RESTORE_SECURITY,
no fallback); with ``--dumped``, one checkpoint with ``--layout dumped`` and the smaller set
run.CHECKPOINT_CAPS_DUMPED instead.

WORKDIR keeps the snapshot (reused when present) and the per-case state directories. The checkout's
toolkit/ is mounted over the image's, so the code under test is this checkout's.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from coldstart.containers import docker_api, run
from coldstart.bench.containers import wait_port_closed

REPO = Path(__file__).resolve().parents[1]
DOCKER_DEFAULT = ["CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP",
                  "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"]
START = DOCKER_DEFAULT + ["SYS_ADMIN", "SYS_PTRACE", "NET_ADMIN", "SYS_TIME"]
MINIMAL = ["DAC_OVERRIDE", "SYS_CHROOT", "SYS_ADMIN", "NET_ADMIN", "SYS_TIME"]  # round 1's result
PORT = 18931


def caps_security(caps: list[str], seccomp: str | None = None) -> dict:
    sec = {"cap_drop": ["ALL"], "cap_add": list(caps)}
    if seccomp:
        sec["security_opt"] = [f"seccomp={seccomp}"]
    return sec


def checkpoint(c, image: str, model: Path, snap: Path, caps: list[str]) -> dict:
    snap.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    ctr = c.containers.run(image, ["checkpoint", str(model), "--out", f"/out/{snap.name}", "--port", str(PORT),
                                   "--server-caps", "none"],
                           entrypoint=["coldstart"], detach=True, shm_size=run.SHM_SIZE, network_mode="host",
                           volumes={str(model): {"bind": str(model), "mode": "ro"},
                                    str(snap.parent): {"bind": "/out", "mode": "rw"},
                                    str(REPO / "toolkit"): {"bind": "/opt/coldstart/toolkit", "mode": "ro"}},
                           environment={"TMPDIR": "/out"}, **caps_security(caps, "unconfined"))
    try:
        res = ctr.wait(timeout=900)
        logs = ctr.logs().decode(errors="replace")
    finally:
        ctr.remove(force=True)
    return {"exit": res.get("StatusCode"), "seconds": round(time.monotonic() - t0, 1), "tail": logs[-600:]}


def restore(c, image: str, snap: Path, model: Path, state: Path, sec: dict, timeout: float = 120) -> dict:
    wait_port_closed(PORT, timeout=30.0)
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    t0 = time.monotonic()
    ctr = c.containers.run(image, ["/snapshot", "--no-fallback"], detach=True, shm_size=run.SHM_SIZE,
                           network_mode="host",
                           volumes={str(snap): {"bind": "/snapshot", "mode": "ro"},
                                    str(model): {"bind": str(model), "mode": "ro"},
                                    str(state): {"bind": "/run/coldstart", "mode": "rw"},
                                    str(REPO / "toolkit"): {"bind": "/opt/coldstart/toolkit", "mode": "ro"}}, **sec)
    try:
        while time.monotonic() - t0 < timeout:
            logs = ctr.logs().decode(errors="replace")
            line = next((ln for ln in logs.splitlines() if ln.startswith('{"url"')), None)
            if line:
                d = json.loads(line)
                return {"restored": d["restored"], "reason": d["fallback_reason"],
                        "seconds": round(time.monotonic() - t0, 2)}
            ctr.reload()
            if ctr.status not in ("created", "running"):
                err = [ln for ln in logs.splitlines() if ln.strip()][-1:] or [""]
                return {"restored": False, "reason": err[0][-400:], "seconds": round(time.monotonic() - t0, 2)}
            time.sleep(0.2)
        return {"restored": False, "reason": f"no summary in {timeout:.0f} s", "log_tail": logs[-800:]}
    finally:
        ctr.remove(force=True)


def round3(c, image: str, model: Path, work: Path, emit, dumped: bool = False) -> None:
    """``dumped``: instead, one checkpoint with ``--layout dumped`` and run.CHECKPOINT_CAPS_DUMPED."""
    from unittest import mock

    from coldstart.pipeline.manifest import read_manifest

    cases = [("checkpoint set", run.CHECKPOINT_CAPS, "hot")] + [
        (f"checkpoint set - {cap}", [x for x in run.CHECKPOINT_CAPS if x != cap], "hot") for cap in run.CHECKPOINT_CAPS]
    if dumped:
        cases = [("dumped layout, its set", run.CHECKPOINT_CAPS_DUMPED, "dumped")]
    for name, caps, layout in cases:
        snap = work / "ckpt" / name.replace(" ", "-")
        shutil.rmtree(snap, ignore_errors=True)
        sec = {**run.CHECKPOINT_SECURITY, "cap_add": caps}
        with mock.patch.object(run, "checkpoint_security", lambda extra=None, sec=sec: sec):
            res = run.checkpoint(c, image, model, snap, extra=["--layout", layout])
        row = {"case": name, "caps": caps, "layout_asked": layout, "seccomp": "unconfined", "exit": res.exit_code,
               "seconds": round(res.seconds, 1), "tail": res.logs.strip().splitlines()[-1:] }
        if res.exit_code == 0 and (snap / "manifest.json").exists():
            row["layout"] = "hot" if read_manifest(snap).layout else "dumped"
            row["layout_says"] = [ln[-400:] for ln in res.logs.splitlines() if "hot layout" in ln][-2:]
            row["restore"] = restore(c, image, snap, model, work / "state", run.RESTORE_SECURITY)
        emit(row)
        shutil.rmtree(snap, ignore_errors=True)


def main() -> None:
    model, image, work = Path(sys.argv[1]).resolve(), sys.argv[2], Path(sys.argv[3]).resolve()
    out = Path(sys.argv[4]) if len(sys.argv) > 4 and not sys.argv[4].startswith("--") else None
    c = docker_api.client()

    def emit(r: dict) -> None:
        print(json.dumps(r), flush=True)
        if out:
            with open(out, "a") as f:
                f.write(json.dumps(r) + "\n")

    if "--round" in sys.argv and sys.argv[sys.argv.index("--round") + 1] == "3":
        return round3(c, image, model, work, emit, dumped="--dumped" in sys.argv)
    snap = work / "snap"
    if not (snap / "manifest.json").exists():
        emit({"case": "checkpoint", "caps": START, "seccomp": "unconfined", **checkpoint(c, image, model, snap, START)})
    if "--round" in sys.argv and sys.argv[sys.argv.index("--round") + 1] == "2":
        cases = [("minimal set", MINIMAL)] + [(f"minimal set - {cap}", [x for x in MINIMAL if x != cap])
                                              for cap in MINIMAL]
        for name, caps in cases:
            emit({"case": name, "caps": caps, "seccomp": "default",
                  **restore(c, image, snap, model, work / "state", caps_security(caps))})
        for name, caps in (("checkpoint with the minimal set + SETPCAP", MINIMAL + ["SETPCAP"]),
                           ("checkpoint with the minimal set + SETPCAP + SYS_PTRACE", MINIMAL + ["SETPCAP", "SYS_PTRACE"]),
                           ("checkpoint with the minimal set + SYS_PTRACE", MINIMAL + ["SYS_PTRACE"])):
            snap2 = work / ("snap-" + str(len(caps)))
            shutil.rmtree(snap2, ignore_errors=True)
            r = checkpoint(c, image, model, snap2, caps)
            emit({"case": name, "caps": caps, "seccomp": "unconfined", **r})
            if r["exit"] == 0:
                emit({"case": name + ", then restored with the minimal set", "caps": MINIMAL, "seccomp": "default",
                      **restore(c, image, snap2, model, work / "state", caps_security(MINIMAL))})
            shutil.rmtree(snap2, ignore_errors=True)
        return
    cases = [("start set, default seccomp", START)] + [(f"start set - {cap}", [x for x in START if x != cap])
                                                       for cap in START]
    for name, caps in cases:
        emit({"case": name, "caps": caps, "seccomp": "default",
              **restore(c, image, snap, model, work / "state", caps_security(caps))})


if __name__ == "__main__":
    main()
