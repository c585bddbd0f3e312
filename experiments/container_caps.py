"""Which capabilities and seccomp settings a restore container needs: restore one snapshot in
containers with different security settings and record restored / fallback reason for each.

    PYTHONPATH=toolkit .venv/bin/python experiments/container_caps.py SNAPSHOT MODEL IMAGE [out.jsonl]

The first survey (results/containers-caps), on a snapshot whose server held every capability, with the
restore on the host's network; experiments/container_least_caps.py is the one that found the set.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from coldstart.containers import docker_api, run
from coldstart.bench.containers import wait_port_closed

DOCKER_DEFAULT = ["CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP",
                  "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"]
CASES = {
    "broad (ALL - SYS_RESOURCE, unconfined)": dict(cap_add=["ALL"], cap_drop=["SYS_RESOURCE"],
                                                    security_opt=["seccomp=unconfined"]),
    "default + SYS_ADMIN + SYS_PTRACE, default seccomp": dict(cap_add=["SYS_ADMIN", "SYS_PTRACE"]),
    "default + SYS_ADMIN + SYS_PTRACE, unconfined": dict(cap_add=["SYS_ADMIN", "SYS_PTRACE"],
                                                         security_opt=["seccomp=unconfined"]),
    "default + SYS_ADMIN, default seccomp": dict(cap_add=["SYS_ADMIN"]),
    "default + SYS_ADMIN + SYS_PTRACE + NET_ADMIN, default seccomp": dict(cap_add=["SYS_ADMIN", "SYS_PTRACE", "NET_ADMIN"]),
    "docker default only": dict(),
    "default + SYS_ADMIN + SYS_PTRACE + NET_ADMIN + SYS_TIME, default seccomp":
        dict(cap_add=["SYS_ADMIN", "SYS_PTRACE", "NET_ADMIN", "SYS_TIME"]),
    "default + SYS_ADMIN + SYS_PTRACE + NET_ADMIN + SYS_TIME, unconfined":
        dict(cap_add=["SYS_ADMIN", "SYS_PTRACE", "NET_ADMIN", "SYS_TIME"], security_opt=["seccomp=unconfined"]),
    "ALL - SYS_RESOURCE, default seccomp": dict(cap_add=["ALL"], cap_drop=["SYS_RESOURCE"]),
    "ALL - SYS_RESOURCE - NET_ADMIN, unconfined": dict(cap_add=["ALL"], cap_drop=["SYS_RESOURCE", "NET_ADMIN"],
                                                        security_opt=["seccomp=unconfined"]),
    "ALL - SYS_RESOURCE - SYS_TIME, unconfined": dict(cap_add=["ALL"], cap_drop=["SYS_RESOURCE", "SYS_TIME"],
                                                       security_opt=["seccomp=unconfined"]),
}


def one(c, image: str, snap: Path, model: Path, sec: dict) -> dict:
    wait_port_closed(json.loads((snap / "manifest.json").read_text())["port"], timeout=30.0)
    t0 = time.monotonic()
    ctr = c.containers.run(image, ["/snapshot"], detach=True, shm_size=run.SHM_SIZE, network_mode="host",
                           tmpfs=run.STATE_TMPFS, volumes={str(snap): {"bind": "/snapshot", "mode": "ro"},
                                                           str(model): {"bind": str(model), "mode": "ro"}}, **sec)
    try:
        while time.monotonic() - t0 < 240:
            logs = ctr.logs().decode(errors="replace")
            line = next((ln for ln in logs.splitlines() if ln.startswith('{"url"')), None)
            if line:
                d = json.loads(line)
                return {"restored": d["restored"], "fallback_reason": d["fallback_reason"],
                        "seconds_to_summary": round(time.monotonic() - t0, 2)}
            ctr.reload()
            if ctr.status not in ("created", "running"):
                return {"restored": False, "fallback_reason": f"container {ctr.status}: " + logs[-300:]}
            time.sleep(0.2)
        return {"restored": False, "fallback_reason": "no summary in 240 s"}
    finally:
        ctr.remove(force=True)


def main() -> None:
    snap, model, image = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), sys.argv[3]
    out = Path(sys.argv[4]) if len(sys.argv) > 4 else None
    c = docker_api.client()
    for name, sec in CASES.items():
        r = {"case": name, "security": sec, **one(c, image, snap, model, sec)}
        print(json.dumps(r), flush=True)
        if out:
            with open(out, "a") as f:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
