#!/bin/bash
# Which read shape does this machine's disk serve fastest cold? Reads FILE once per shape per round
# with fio (page cache dropped before each read), the shapes' order rotated every round; prints one
# "round shape GiB/s" line per read, then each shape's median.
#   experiments/fio_shapes.sh FILE [ROUNDS]
set -euo pipefail
FILE=$1 ROUNDS=${2:-8}
T=$(stat -c %s "$FILE"); MiB=1048576
part() { echo $(( T / $1 / MiB * MiB )); }
SHAPES=(
  "odirect-4jobs-1M|4|--rw=read --size=$(part 4) --offset_increment=$(part 4) --direct=1 --bs=1M --ioengine=psync"
  "odirect-8jobs-1M|8|--rw=read --size=$(part 8) --offset_increment=$(part 8) --direct=1 --bs=1M --ioengine=psync"
  "odirect-8jobs-1M-interleaved|8|--rw=read:7M --offset_increment=1M --io_size=$(part 8) --direct=1 --bs=1M --ioengine=psync"
  "odirect-qd16-1M|1|--rw=read --direct=1 --bs=1M --ioengine=io_uring --iodepth=16"
  "odirect-qd32-256K|1|--rw=read --direct=1 --bs=256K --ioengine=io_uring --iodepth=32"
  "buffered-4jobs-1M|4|--rw=read --size=$(part 4) --offset_increment=$(part 4) --direct=0 --bs=1M --ioengine=psync"
  "buffered-2jobs-16M|2|--rw=read --size=$(part 2) --offset_increment=$(part 2) --direct=0 --bs=16M --ioengine=psync"
)
out=$(mktemp); trap 'rm -f "$out"' EXIT
n=${#SHAPES[@]}
for r in $(seq 1 "$ROUNDS"); do
  for k in $(seq 0 $((n - 1))); do
    IFS='|' read -r name jobs args <<< "${SHAPES[$(( (k + r) % n ))]}"
    sync; echo 3 > /proc/sys/vm/drop_caches
    # shellcheck disable=SC2086
    bw=$(fio --name=s --filename="$FILE" --readonly --numjobs="$jobs" --group_reporting --output-format=json $args \
         | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"]/2**30,3))')
    echo "$r $name $bw" | tee -a "$out"
  done
done
echo "medians over $ROUNDS rounds (GiB/s):"
python3 - "$out" <<'PY'
import statistics, sys, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r, name, bw = line.split(); d[name].append(float(bw))
for name, v in d.items():
    print(f"  {name:32s} {statistics.median(v):.2f}  (min {min(v):.2f}, max {max(v):.2f})")
PY
