#!/usr/bin/env bash
# The whole test suite, from a fresh clone: system packages, the test beds,
# offline manifest checks, build, every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/system-packages.sh test
bash tests/manifests.sh
bash tests/unused-dependencies.sh
# The OpenAPI fuzzer of actors/tests/openapi_fuzz.rs (a virtual environment, reused).
EPO_SCHEMATHESIS=$(bash tests/openapi-fuzz-setup.sh)
export EPO_SCHEMATHESIS
export EPO_CLIENTS_PYTHON; EPO_CLIENTS_PYTHON=$(bash tests/python-clients-setup.sh)  # actors/tests/python_clients.rs
if [ "$(id -u)" -eq 0 ]; then
  bash tests/kvm-testbed.sh up >/dev/null
  trap 'bash tests/kvm-testbed.sh down >/dev/null 2>&1 || true' EXIT
else
  echo "not root: the kvm test bed (libvirtd, sshd, bridge) is not set up; its tests will say they skip" >&2
fi
log=$(mktemp)
trap 'rm -f "$log"; [ "$(id -u)" -eq 0 ] && bash tests/kvm-testbed.sh down >/dev/null 2>&1 || true' EXIT
status=0
cargo test --workspace --locked "$@" 2>&1 | tee "$log" || status=$?
# One closing line for the whole run (cargo prints one per test binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
exit "$status"
