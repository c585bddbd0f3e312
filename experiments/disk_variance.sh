#!/bin/bash
# How steady is this machine's disk? Reads FILE sequentially with O_DIRECT (fio, QD 16, 1 MiB) in
# PASSES passes of SIZE each, PAUSE seconds apart, logging the bandwidth every 100 ms; prints one
# line per pass: its mean GiB/s, then the 100 ms samples (GiB/s). No page cache involved.
#   experiments/disk_variance.sh FILE [PASSES] [SIZE] [PAUSE]
set -euo pipefail
FILE=$1 PASSES=${2:-4} SIZE=${3:-2G} PAUSE=${4:-20}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 "$PASSES"); do
  (cd "$tmp" && fio --name=p$i --filename="$FILE" --rw=read --bs=1M --iodepth=16 --ioengine=libaio \
     --direct=1 --readonly --size="$SIZE" --log_avg_msec=100 --write_bw_log=p$i --output-format=json > p$i.json)
  python3 - "$tmp/p$i.json" "$tmp/p${i}_bw.1.log" "$i" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["jobs"][0]["read"]
samples = [int(l.split(",")[1]) / 2**20 for l in open(sys.argv[2]) if l.strip()]  # KiB/s -> GiB/s
print(f"pass {sys.argv[3]}: {r['bw_bytes'] / 2**30:.2f} GiB/s mean;", " ".join(f"{x:.2f}" for x in samples))
PY
  [ "$i" -lt "$PASSES" ] && sleep "$PAUSE"
done
