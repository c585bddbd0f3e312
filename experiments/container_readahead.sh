#!/usr/bin/env bash
# A cold container restore of the tiny model with the disk's read-ahead at 128 KiB (Linux's default)
# and at 8 MiB (what the VMs here come with): how many bytes the restore reads, and how soon it serves.
# Needs root and the bench's dockerd (scripts/start-docker; DOCKER_HOST set). Restores read_ahead_kb
# to 8192 afterwards. Usage: experiments/container_readahead.sh DEVICE (e.g. vda)
set -euo pipefail
dev=${1:?usage: $0 DEVICE}
knob=/sys/block/$dev/queue/read_ahead_kb
trap 'echo 8192 > "$knob"' EXIT
for ra in 128 8192; do
  echo "$ra" > "$knob"
  .venv/bin/coldstart bench container --sizes tiny --methods restore,restore+hostwarm --caches warm,cold \
    --reps 3 --out "results/spot-checks/readahead/ra$ra"
done
