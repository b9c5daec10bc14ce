#!/usr/bin/env bash
# Installs Schemathesis, the OpenAPI fuzzer actors/tests/openapi_fuzz.rs runs
# against the discovery API, into a virtual environment that later runs
# reuse; prints the path of its `schemathesis` for EPO_SCHEMATHESIS.
# python3-venv comes from tests/system-packages.sh test.
set -euo pipefail
version=4.32.5
cache=/var/cache/egress-proxies-operator
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies-operator"
  mkdir -p "$cache"
fi
venv="$cache/venv"
st="$venv/bin/schemathesis"
installed=$("$venv/bin/pip" show schemathesis 2>/dev/null | sed -n 's/^Version: //p' || true)
if [ ! -x "$st" ] || [ "$installed" != "$version" ]; then
  echo "installing schemathesis $version into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$version" >&2
fi
echo "$st"
