#!/usr/bin/env bash
# Containers stage: Debian's docker.io (dockerd 20.10, containerd, runc) for scripts/start-docker, and
# debootstrap to build the runtime image's Debian base from Debian's archive (no image can be pulled
# here). The packages' own services are NOT left running: scripts/start-docker runs a dockerd of ours
# with its own data root and socket. Idempotent: a stamp keyed by the package list.
set -euo pipefail
CACHE="${COLDSTART_CACHE:-/var/cache/coldstart}"
PKGS=(docker.io debootstrap)
stamp="$CACHE/containers-$(printf '%s\n' "${PKGS[@]}" | sha256sum | cut -c1-16).done"
if [[ -e "$stamp" ]] && command -v dockerd >/dev/null && command -v debootstrap >/dev/null; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
made_policy=0
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made_policy=1
fi
trap 'if [[ $made_policy == 1 ]]; then rm -f /usr/sbin/policy-rc.d; fi' EXIT
if ! apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
fi
if [[ -d /run/systemd/system ]]; then
  systemctl disable --now docker docker.socket containerd >/dev/null 2>&1 || true
fi
command -v dockerd >/dev/null && command -v debootstrap >/dev/null
mkdir -p "$CACHE"; touch "$stamp"
