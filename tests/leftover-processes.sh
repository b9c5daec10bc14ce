#!/usr/bin/env bash
# Fails (exit 1), listing them, if processes a test run started outlived it;
# then kills them. Usage: leftover-processes.sh DIR, where DIR is the
# temporary directory the run's tests used (tests/run.sh gives them a fresh
# one as TMPDIR). Every process a test starts names a path in it, runs in
# it or writes a file in it: operators (their config and log), local proxies
# (their instance directory and log, also Squid running from /run as root),
# the tests' own Squids, bwrap, Chromium. The test beds' daemons (libvirtd,
# the kvm bed's sshd, dnsmasq) do none of that and are left alone.
set -euo pipefail
dir=${1:?usage: leftover-processes.sh DIR}
case "$dir" in
  /*/*) ;;
  *) echo "leftover-processes.sh: $dir is too broad a directory" >&2; exit 2 ;;
esac

# $dir or a path in it.
inside() { [[ $1 == "$dir" || $1 == "$dir"/* ]]; }

left=()
for proc in /proc/[0-9]*; do
  pid=${proc#/proc/}
  # Not this script, nor a subshell of it.
  cmdline=$({ tr '\0' '\n' <"$proc/cmdline"; } 2>/dev/null) || continue
  [[ $cmdline == *leftover-processes.sh* ]] && continue
  # Zombies are their parent's to reap.
  state=$(awk '{ sub(/.*\) /, ""); print $1 }' "$proc/stat" 2>/dev/null) || continue
  [[ $state == Z || -z $state ]] && continue
  found=
  while IFS= read -r arg; do
    if [[ $arg == *"$dir" || $arg == *"$dir"/* ]]; then found=1; break; fi
  done <<<"$cmdline"
  if [[ -z $found ]]; then
    # A deleted directory reads as "<path> (deleted)".
    while IFS= read -r path; do
      if inside "${path% (deleted)}"; then found=1; break; fi
    done < <(readlink "$proc/cwd" "$proc"/fd/* 2>/dev/null || true)
  fi
  [[ -n $found ]] && left+=("$pid")
done

[ "${#left[@]}" -eq 0 ] && exit 0
echo "FAILED: ${#left[@]} process(es) started by the tests outlived them (every test must reap what it starts):" >&2
ps -o pid=,ppid=,user=,lstart=,args= -p "$(IFS=,; echo "${left[*]}")" >&2 || true
kill -KILL "${left[@]}" 2>/dev/null || true
exit 1
