#!/usr/bin/env bash
# How long one exec of criu takes in a restore container, page cache dropped first (the cold start
# of every container restore pays it once) and again at once (warm): two criu builds side by side.
# Usage: experiments/criu_exec_cold.sh IMAGE REPS LABEL=CRIU_BINARY...   (our dockerd: DOCKER_HOST)
# Prints one line per exec: label, cold|warm, microseconds (timed inside the container).
set -euo pipefail
image=$1 reps=$2; shift 2
mounts=() labels=()
for a in "$@"; do labels+=("${a%%=*}"); mounts+=(-v "${a#*=}:/opt/${a%%=*}:ro"); done
for ((r = 0; r < reps; r++)); do
  for l in "${labels[@]}"; do
    sync; echo 3 >/proc/sys/vm/drop_caches
    docker run --rm --network none --entrypoint /bin/sh "${mounts[@]}" "$image" -c "
      t() { s=\$(date +%s%N); /opt/$l --version >/dev/null; e=\$(date +%s%N); echo \$(( (e - s) / 1000 )); }
      echo \"$l cold \$(t)\"; echo \"$l warm \$(t)\""
  done
done
