#!/usr/bin/env bash
# Installs what the Python client's tests (clients/python/tests, run by
# actors/tests/python_clients.rs) need — httpx, Scrapy, requests, pytest,
# mypy, every version pinned in clients/python/requirements-test.txt — into
# a virtual environment that later runs reuse while the pins are unchanged;
# prints the path of its `python` for EPO_CLIENTS_PYTHON.
# python3-venv comes from tests/system-packages.sh test.
set -euo pipefail
cd "$(dirname "$0")/.."
requirements=clients/python/requirements-test.txt
cache=/var/cache/egress-proxies-operator
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies-operator"
  mkdir -p "$cache"
fi
venv="$cache/venv-clients"
stamp="$venv/requirements.sha256"
wanted=$(sha256sum "$requirements" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "installing the Python client's test dependencies into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check --require-virtualenv -r "$requirements" >&2
  echo "$wanted" >"$stamp"
fi
echo "$venv/bin/python"
