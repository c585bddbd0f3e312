# Sourced by scripts/setup.d hooks: install Debian packages without starting their services (a
# package's own daemon would take ports or sockets host-wide; our scripts start their own instances).
# policy-rc.d exit 101 = "do not start services from maintainer scripts"; only if none is in place.
apt_install_no_services() {
  export DEBIAN_FRONTEND=noninteractive
  local made_policy=0 rc=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made_policy=1
  fi
  if ! apt-get install -y -qq --no-install-recommends "$@" >/dev/null; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@" >/dev/null || rc=$?
  fi
  [[ $made_policy == 1 ]] && rm -f /usr/sbin/policy-rc.d
  return $rc
}
