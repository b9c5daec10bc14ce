#!/usr/bin/env bash
# Fails when a crate of the workspace declares a dependency its code never
# uses (cargo-machete, installed once into a cache directory and reused).
# The parts crate also warns at compile time (`unused_crate_dependencies`).
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.9.2
cache=/var/cache/egress-proxies-operator
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies-operator"
  mkdir -p "$cache"
fi
machete="$cache/tools/bin/cargo-machete"
if [ ! -x "$machete" ] || [ "$("$machete" --version)" != "$version" ]; then
  echo "installing cargo-machete $version into $cache/tools" >&2
  CARGO_TARGET_DIR="$cache/tools-build" cargo install --quiet --locked \
    --root "$cache/tools" cargo-machete --version "$version" >&2
fi
"$machete"
