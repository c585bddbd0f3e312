#!/usr/bin/env bash
# Does reading docker's runtime binaries ahead shorten a cold `docker create` + `docker start`?
# Page cache dropped before each start; "pre" reads runc, the shim, docker-proxy and docker-init
# first (vmtouch -t). A bare container (sleep), a published port as the restore has.
# Needs root and the bench's dockerd (scripts/start-docker; DOCKER_HOST set).
# Usage: experiments/docker_start_prefetch.sh IMAGE [PAIRS]
set -euo pipefail
img=${1:?usage: $0 IMAGE [PAIRS]}
for _ in $(seq "${2:-3}"); do
  for v in none pre; do
    sync; echo 3 > /proc/sys/vm/drop_caches
    if [ "$v" = pre ]; then
      vmtouch -qt /usr/sbin/runc /usr/bin/containerd-shim-runc-v2 /usr/sbin/docker-proxy "$(readlink -f /usr/bin/docker-init)"
    fi
    t0=$(date +%s.%N)
    id=$(docker create -p 18123:8000 --entrypoint /bin/sleep "$img" 5)
    t1=$(date +%s.%N)
    docker start "$id" >/dev/null
    t2=$(date +%s.%N)
    echo "$v create $(echo "$t1-$t0" | bc) start $(echo "$t2-$t1" | bc)"
    docker rm -f "$id" >/dev/null
  done
done
