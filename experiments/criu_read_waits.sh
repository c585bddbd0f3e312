#!/bin/bash
# Where does CRIU's restore wait on a cold page cache? One cold host restore of SNAP with CRIU's log at
# -v4 (COLDSTART_CRIU_LOG_LEVEL=4), then, from its restore.log: per restored process, the restorer's
# preadv calls (the pages it reads rather than maps), their bytes and the seconds they took; and the
# longest gaps between log lines. Run from the repo root; kills the restored server afterwards.
#   experiments/criu_read_waits.sh SNAP
set -euo pipefail
SNAP=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
sync; echo 3 > /proc/sys/vm/drop_caches
COLDSTART_CRIU_LOG_LEVEL=4 timeout 300 .venv/bin/python -m coldstart restore "$SNAP" --no-serve 2>&1 \
  | grep '^{"url"' > "$tmp/summary.json" || true
state=${COLDSTART_STATE_DIR:-/run/coldstart}
cp "$(ls -t "$state"/restores/*/criu/restore.log | head -1)" "$tmp/restore.log"
pkill -9 -f "unshare --pid" || true
python3 - "$tmp/summary.json" "$tmp/restore.log" <<'PY'
import json, re, sys
ev = json.loads(open(sys.argv[1]).read())["events"]
print("events:", {k: round(ev[k], 2) for k in ("RESTORE_ISSUED", "RESTORE_DONE", "WAKE_KV", "FIRST_TOKEN")})
lines = open(sys.argv[2], errors="replace").read().splitlines()
per = {}
for i, l in enumerate(lines[:-1]):
    m = re.match(r"\((\d+\.\d+)\) pie: (\d+): Preadv ", l)
    m2 = re.match(r"\((\d+\.\d+)\) pie: \d+: `- returned (\d+)", lines[i + 1])
    if m and m2:
        d = per.setdefault(m.group(2), [0, 0.0, 0, 0.0])
        d[0] += 1; d[1] += float(m2.group(1)) - float(m.group(1)); d[2] += int(m2.group(2))
        d[3] = max(d[3], float(m2.group(1)) - float(m.group(1)))
for pid, (n, t, b, worst) in sorted(per.items(), key=lambda x: -x[1][1]):
    print(f"process {pid}: {n} preadv, {b / 2**20:.1f} MiB, {t:.3f} s in them (longest {worst * 1000:.0f} ms)")
ts = [(float(m.group(1)), i) for i, l in enumerate(lines) if (m := re.match(r"\((\d+\.\d+)\)", l))]
print(f"log: {len(lines)} lines over {ts[-1][0]:.2f} s; the longest gaps:")
for g, i in sorted(((b[0] - a[0], a[1]) for a, b in zip(ts, ts[1:])), reverse=True)[:8]:
    print(f"  {g * 1000:4.0f} ms after: {lines[i][:110]}")
PY
