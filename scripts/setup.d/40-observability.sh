#!/usr/bin/env bash
# Observability stage: a real Prometheus + Pushgateway (Debian's packages) for the metrics tests and for
# users who want to look (scripts/start-observability runs them on 127.0.0.1 with their own data dir).
# The packages' own systemd services are NOT left running: they would take ports 9090/9091 host-wide.
# Idempotent: a stamp under $COLDSTART_CACHE keyed by the package list.
set -euo pipefail
CACHE="${COLDSTART_CACHE:-/var/cache/coldstart}"
PKGS=(prometheus prometheus-pushgateway)
stamp="$CACHE/observability-$(printf '%s\n' "${PKGS[@]}" | sha256sum | cut -c1-16).done"
if [[ -e "$stamp" ]] && command -v prometheus >/dev/null && command -v prometheus-pushgateway >/dev/null; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d exit 101 = "do not start services from maintainer scripts"; only if none is in place.
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
  systemctl disable --now prometheus prometheus-pushgateway >/dev/null 2>&1 || true
fi
command -v prometheus >/dev/null && command -v prometheus-pushgateway >/dev/null
mkdir -p "$CACHE"; touch "$stamp"
