#!/usr/bin/env bash
# Node stage: build mkfs.erofs 1.8.6 from the pinned upstream tarball, for `coldstart snapshot pack
# --compressor zstd`. Debian 12's erofs-utils 1.5 writes lz4 only, which does not compress the
# bench model's random bf16 weights (1.02x); the kernel here reads zstd, lzma and deflate images.
# Built once per (tarball, recipe) into $COLDSTART_CACHE/erofs-utils/<key>/bin/mkfs.erofs, published
# as $COLDSTART_CACHE/erofs-utils/current; built in a temp dir and renamed, so an interrupted build
# leaves nothing half-installed. Only mkfs.erofs is kept (no FUSE, no SELinux labels).
set -euo pipefail
ROOT="${ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}"
CACHE="${COLDSTART_CACHE:-/var/cache/coldstart}/erofs-utils"
log() { printf '[70-erofs-utils] %s\n' "$*"; }
die() { printf '70-erofs-utils: error: %s\n' "$*" >&2; exit 1; }
read -r SHA NAME URL < <(grep -v '^#' "$ROOT/erofs-utils/TARBALL.sha256" | head -n1)
RECIPE="configure --disable-fuse --without-selinux --enable-lzma --enable-multithreading; v1"
key=$(printf '%s\n%s\n' "$SHA" "$RECIPE" | sha256sum | cut -c1-16)
out="$CACHE/$key"
if [[ ! -x "$out/bin/mkfs.erofs" ]]; then
  DEPS=(build-essential autoconf automake libtool pkg-config uuid-dev liblz4-dev libzstd-dev liblzma-dev zlib1g-dev curl)
  missing=()
  for p in "${DEPS[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
  if [[ ${#missing[@]} -gt 0 ]]; then
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  mkdir -p "$CACHE"
  rm -rf "$CACHE"/build.*
  tmp=$(mktemp -d "$CACHE/build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  log "building mkfs.erofs from $NAME"
  curl -fsS -o "$tmp/$NAME" "$URL" || die "cannot fetch $URL (is deb.debian.org reachable?)"
  echo "$SHA  $tmp/$NAME" | sha256sum -c --quiet - || die "$NAME does not match its pinned sha256"
  tar -xzf "$tmp/$NAME" -C "$tmp"
  src=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d -name 'erofs-utils-*' | head -n1)
  (cd "$src" && ./autogen.sh >/dev/null 2>&1 && ./configure -q --prefix=/ --disable-fuse --without-selinux \
      --enable-lzma --enable-multithreading >/dev/null && make -s -j"$(nproc)" >/dev/null 2>&1) \
    || die "building erofs-utils failed (run by hand in $src to see why)"
  mkdir -p "$tmp/out/bin"
  cp "$src/mkfs/mkfs.erofs" "$tmp/out/bin/mkfs.erofs"
  rm -rf "$out"
  mv "$tmp/out" "$out"
fi
ln -sfn "$out" "$CACHE/current.tmp"
mv -T "$CACHE/current.tmp" "$CACHE/current"
