#!/usr/bin/env bash
# setup hook (criu tests/bench): gcc for the test programs, vmtouch for the warm-overlapped bench,
# and the allocators the allocator-safety test runs under: gperftools' tcmalloc (what vLLM-CPU
# LD_PRELOADs when it finds one) and jemalloc (assumes MADV_DONTNEED memory reads back as zeros).
set -euo pipefail
PKGS=(gcc libc6-dev vmtouch libtcmalloc-minimal4 libjemalloc2 util-linux)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "[25-criu-tests] installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
fi
