#!/usr/bin/env bash
# Registry stage: Debian's docker-registry (the OCI distribution registry, 2.8) that the tests and the
# benchmarks run on 127.0.0.1 with their own storage (coldstart.registry.server starts it; the
# package's own service is not left running), and fuse3 (fusermount3) for the lazy mount.
# Idempotent: a stamp keyed by the package list.
set -euo pipefail
CACHE="${COLDSTART_CACHE:-/var/cache/coldstart}"
PKGS=(docker-registry fuse3)
stamp="$CACHE/registry-$(printf '%s\n' "${PKGS[@]}" | sha256sum | cut -c1-16).done"
if [[ -e "$stamp" ]] && command -v docker-registry >/dev/null && command -v fusermount3 >/dev/null; then
  exit 0
fi
source "${ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}/scripts/lib/apt.sh"
apt_install_no_services "${PKGS[@]}"
if [[ -d /run/systemd/system ]]; then
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi
command -v docker-registry >/dev/null && command -v fusermount3 >/dev/null
mkdir -p "$CACHE"; touch "$stamp"
