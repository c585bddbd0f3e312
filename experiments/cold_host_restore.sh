#!/bin/bash
# One cold host restore of a snapshot, from the repo root: page cache dropped, then
# `coldstart restore SNAP --no-serve`; prints the label, MB the snapshot's disk read meanwhile, the
# restore's main events and its canary step (WAKE_KV to FIRST_TOKEN). The environment passes through
# (e.g. COLDSTART_CRIU_READ_AHEAD=0 or all). Kills the restored server afterwards.
#   experiments/cold_host_restore.sh SNAP LABEL
set -euo pipefail
SNAP=$1 LABEL=$2
DEV=$(basename "$(df --output=source "$SNAP" | tail -1)")
sync; echo 3 > /proc/sys/vm/drop_caches
r0=$(awk -v d="$DEV" '$3==d{print $6}' /proc/diskstats)
out=$(timeout 300 .venv/bin/python -m coldstart restore "$SNAP" --no-serve 2>&1 | grep '^{"url"' || true)
r1=$(awk -v d="$DEV" '$3==d{print $6}' /proc/diskstats)
echo "$out" | python3 -c "
import json, sys
d = json.loads(sys.stdin.read()); ev = d['events']
print('$LABEL', 'MB', ($r1 - $r0) * 512 // 10**6, {k: round(ev[k], 2) for k in ('ENTRY_READY', 'RESTORE_ISSUED', 'WARM_START', 'RESTORE_DONE', 'WAKE_KV', 'FIRST_TOKEN') if k in ev},
      'canary', round(ev['FIRST_TOKEN'] - ev['WAKE_KV'], 2))"
pkill -9 -f "unshare --pid" || true
sleep 1
