"""Which modules a restore imports, and when, against its timeline: run as the entrypoint would be
(`python experiments/entry_imports.py SNAPSHOT [restore options]`, PYTHONPATH=toolkit), with a
finder first on sys.meta_path that notes each module the first time it is looked up. Prints, per
phase of the timeline, the modules first imported in it and the seconds from the first to the last.
Restores with --no-serve and stops the server after."""
from __future__ import annotations

import json
import os
import signal
import sys
import time

SEEN: list[tuple[float, str]] = []


class _Note:
    def find_spec(self, name, path=None, target=None):
        if name not in sys.modules:
            SEEN.append((time.time(), name))
        return None


def main() -> None:
    sys.meta_path.insert(0, _Note())
    out = "/tmp/entry_imports_timeline.jsonl"
    if os.path.exists(out):
        os.unlink(out)
    sys.argv = ["coldstart", "restore", *sys.argv[1:], "--no-serve", "--timeline-out", out]
    import coldstart.main

    coldstart.main.main()
    rows = [json.loads(line) for line in open(out)]
    events = {r["name"]: r["t"] for r in rows}
    t0 = float(os.environ["COLDSTART_T0"])
    marks = sorted((t, k) for k, t in events.items() if isinstance(t, (int, float)))
    byphase: dict[str, list[tuple[float, str]]] = {}
    for wall, name in SEEN:
        t = wall - t0
        phase = "before " + marks[0][1]
        for mt, mk in marks:
            if t >= mt:
                phase = "after " + mk
        byphase.setdefault(phase, []).append((t, name))
    for phase, mods in byphase.items():
        top = [n for _, n in mods if "." not in n or n.startswith("coldstart.")]
        print(f"{phase}: {len(mods)} modules, {mods[0][0]:.3f}-{mods[-1][0]:.3f} s: {', '.join(top[:40])}")
    print("events:", " ".join(f"{k}={t:.3f}" for t, k in marks))
    pid = next((r["attrs"].get("pid") for r in rows if r["name"] == "READY"), None)
    if pid:
        os.kill(int(pid), signal.SIGTERM)


if __name__ == "__main__":
    main()
