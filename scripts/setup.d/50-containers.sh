#!/usr/bin/env bash
# Containers stage: Debian's docker.io (dockerd 20.10, containerd, runc) and crun (a lighter OCI runtime,
# registered beside runc) for scripts/start-docker, and debootstrap to build the runtime image's Debian
# base from Debian's archive (no image can be pulled here). The packages' own services are NOT left
# running: scripts/start-docker runs a dockerd of ours with its own data root and socket. Idempotent: a
# stamp keyed by the package list.
set -euo pipefail
CACHE="${COLDSTART_CACHE:-/var/cache/coldstart}"
PKGS=(docker.io debootstrap crun)
stamp="$CACHE/containers-$(printf '%s\n' "${PKGS[@]}" | sha256sum | cut -c1-16).done"
have_all() { command -v dockerd >/dev/null && command -v debootstrap >/dev/null && command -v crun >/dev/null; }
if [[ -e "$stamp" ]] && have_all; then
  exit 0
fi
source "${ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}/scripts/lib/apt.sh"
apt_install_no_services "${PKGS[@]}"
if [[ -d /run/systemd/system ]]; then
  systemctl disable --now docker docker.socket containerd >/dev/null 2>&1 || true
fi
have_all
mkdir -p "$CACHE"; touch "$stamp"
