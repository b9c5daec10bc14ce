#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages egress-proxies-operator needs.
#   tests/system-packages.sh build   what compiling needs
#   tests/system-packages.sh test    that, plus the real components the tests run
# Only missing packages are installed; service start-up during installation is
# suppressed (tests start their own daemons on loopback).
set -euo pipefail

build=(pkg-config libssl-dev libvirt-dev git)
# prometheus: for /usr/bin/promtool (tests/monitoring.sh); its daemon is never
# started (policy-rc.d below, and stopped if it runs anyway).
# curl: the tests and the docs' examples (actors/tests/docs_executed.rs runs them).
test_extra=(squid iproute2 xorriso openssl chromium chromium-driver python3-venv bubblewrap prometheus curl)

case "${1:-build}" in
  build) wanted=("${build[@]}") ;;
  test) wanted=("${build[@]}" "${test_extra[@]}") ;;
  *) echo "usage: $0 build|test" >&2; exit 2 ;;
esac

missing=()
for pkg in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null; then
  echo "error: these system packages are needed but apt-get is not available: ${missing[*]}" >&2
  echo "       install them with your package manager and run again." >&2
  exit 1
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "error: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi

echo "installing system packages: ${missing[*]}" >&2
# Keep package scripts from starting daemons (sshd, libvirtd, squid) on install.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
  "${sudo[@]}" chmod +x "$policy"
  created_policy=1
fi
trap '[ "$created_policy" = 1 ] && "${sudo[@]}" rm -f "$policy"' EXIT
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

# prometheus is installed for promtool only: its daemon must neither run now
# nor start at the next boot (policy-rc.d kept it from starting just now on a
# machine without a policy of its own).
if [[ " ${missing[*]} " == *" prometheus "* ]]; then
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    "${sudo[@]}" systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    running=$(systemctl is-active prometheus.service 2>/dev/null || true)
    [ "$running" = active ] || running=
  else
    "${sudo[@]}" /etc/init.d/prometheus stop >/dev/null 2>&1 || true
    "${sudo[@]}" update-rc.d prometheus disable >/dev/null 2>&1 || true
    running=
    pidfile=/run/prometheus/prometheus.pid
    if [ -r "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then running=$(cat "$pidfile"); fi
  fi
  if [ -n "$running" ]; then
    echo "warning: the prometheus daemon still runs after installing the package ($running); only promtool is needed: stop it" >&2
  fi
fi
