#!/usr/bin/env bash
# setup hook: build CRIU 4.2.1 stock + patched (mmap restore) into $COLDSTART_CACHE/criu.
# Idempotent: scripts/build-criu is cached by (tarball sha, patches sha).
set -euo pipefail
ROOT="${ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}"
# build deps (also in scripts/setup's apt list; repeated here so the hook stands alone)
DEPS=(build-essential dpkg-dev libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
      python3-protobuf libnl-3-dev libcap-dev libnet1-dev pkg-config libbsd-dev
      libnftables-dev uuid-dev libaio-dev xz-utils patch)
missing=()
for p in "${DEPS[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "[20-criu] installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
exec "$ROOT/scripts/build-criu"
