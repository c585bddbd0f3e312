#!/usr/bin/env bash
# Lazy stage: build the FUSE daemon (lazyfs/, Rust) that mounts a tree from the registry and fetches
# its chunks on first read. Built once per content of its sources: the binary lands in
# $COLDSTART_CACHE/lazyfs/<key>/coldstart-lazyfs, key = hash of Cargo.toml, Cargo.lock and src/**,
# and $COLDSTART_CACHE/lazyfs/current points at it. Cargo's target dir lives in the cache too, so
# the repo stays clean and a rebuild after a small change is incremental.
set -euo pipefail
ROOT="${ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}"
CACHE="${COLDSTART_CACHE:-/var/cache/coldstart}"
SRC="$ROOT/lazyfs"
key=$(cd "$SRC" && find Cargo.toml Cargo.lock src -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
out="$CACHE/lazyfs/$key"
if [[ ! -x "$out/coldstart-lazyfs" ]]; then
  command -v cargo >/dev/null || { echo "[65-lazyfs] cargo not found (Rust toolchain needed)" >&2; exit 1; }
  echo "[65-lazyfs] building coldstart-lazyfs ($key)"
  export CARGO_TARGET_DIR="$CACHE/lazyfs/target"
  cargo build --release --locked --quiet --manifest-path "$SRC/Cargo.toml"
  mkdir -p "$out"
  cp "$CARGO_TARGET_DIR/release/coldstart-lazyfs" "$out/coldstart-lazyfs.tmp"
  mv "$out/coldstart-lazyfs.tmp" "$out/coldstart-lazyfs"
fi
ln -sfn "$out" "$CACHE/lazyfs/current.tmp"
mv -T "$CACHE/lazyfs/current.tmp" "$CACHE/lazyfs/current"
