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
source "${ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}/scripts/lib/apt.sh"
apt_install_no_services "${PKGS[@]}"
if [[ -d /run/systemd/system ]]; then
  systemctl disable --now prometheus prometheus-pushgateway >/dev/null 2>&1 || true
fi
command -v prometheus >/dev/null && command -v prometheus-pushgateway >/dev/null
mkdir -p "$CACHE"; touch "$stamp"
