#!/usr/bin/env bash
# The whole test suite, from a fresh clone: system packages, build, every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/system-packages.sh test
cargo test --workspace --locked "$@"
