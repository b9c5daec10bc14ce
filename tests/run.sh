#!/usr/bin/env bash
# The whole test suite, from a fresh clone: system packages, the test beds,
# offline manifest checks, build, every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/system-packages.sh test
bash tests/manifests.sh
# The real kubectl the Kubernetes doc test and the fake API server's tests drive (manifests.sh made sure of one).
export EPO_KUBECTL; EPO_KUBECTL=$(command -v kubectl)
# A pyenv shim needs pyenv's environment, which the tests clear: take the program it runs.
case $EPO_KUBECTL in */shims/kubectl) EPO_KUBECTL=$(pyenv which kubectl) ;; esac
bash tests/monitoring.sh
bash tests/unused-dependencies.sh
# The OpenAPI fuzzer of actors/tests/openapi_fuzz.rs (a virtual environment, reused).
EPO_SCHEMATHESIS=$(bash tests/openapi-fuzz-setup.sh)
export EPO_SCHEMATHESIS
export EPO_CLIENTS_PYTHON; EPO_CLIENTS_PYTHON=$(bash tests/python-clients-setup.sh)  # actors/tests/python_clients.rs
# The tests' temporary files go to a directory of this run's own (shared by
# every user the tests run as, like /tmp): whatever runs there once the
# tests are done was left behind by them.
tests_tmp=$(mktemp -d "${TMPDIR:-/tmp}/epo-tests.XXXXXX")
chmod 1777 "$tests_tmp"
log=$(mktemp)
bed=
cleanup() {
  # Also when interrupted: the proxies the tests' operators started run in
  # process groups of their own, which a Ctrl-C does not reach.
  bash tests/leftover-processes.sh "$tests_tmp" >/dev/null 2>&1 || true
  rm -rf "$log" "$tests_tmp"
  if [ -n "$bed" ]; then bash tests/kvm-testbed.sh down >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
if [ "$(id -u)" -eq 0 ]; then
  bed=up
  bash tests/kvm-testbed.sh up >/dev/null
else
  echo "not root: the kvm test bed (libvirtd, sshd, bridge) is not set up; its tests will say they skip" >&2
fi
status=0
# --no-fail-fast: one failing test binary does not hide the results of the others.
TMPDIR=$tests_tmp cargo test --workspace --locked --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
# One closing line for the whole run (cargo prints one per test binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
# A run that leaves a process behind fails.
bash tests/leftover-processes.sh "$tests_tmp" || status=1
exit "$status"
