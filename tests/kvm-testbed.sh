#!/usr/bin/env bash
# The kvm provider's test bed, on this machine only, without systemd:
# libvirtd with a `dir` pool, sshd instances on 127.0.0.1 (ports 2222 and
# 2223: two "hosts" in front of the same daemon) for a dedicated user in the
# libvirt group with its own keys and known_hosts, and a private bridge with
# dnsmasq DHCP. Idempotent.
#
#   tests/kvm-testbed.sh up     set up (prints the env file's path)
#   tests/kvm-testbed.sh down   stop sshd, dnsmasq and libvirtd, remove the bridge
#
# Tests read /run/epo-kvm-testbed/env; without it they skip, saying why.
set -euo pipefail

BED=/run/epo-kvm-testbed
USER_NAME=epo-kvm
BRIDGE=br-epo
SUBNET=10.213.77
PORTS=(2222 2223)

log() { echo "kvm-testbed: $*" >&2; }

install_packages() {
  local pkgs=(libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86 qemu-utils
              ovmf openssh-server openssh-client dnsmasq-base iproute2)
  local missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  # Keep package scripts from starting sshd on :22 and libvirtd themselves.
  local created=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; created=1; fi
  apt-get update -qq
  # qemu-utils and qemu-system-x86 must come from one qemu build: a newer
  # qemu-utils already here (a backport) Breaks Debian's qemu-system-common,
  # and apt will neither downgrade it nor may it remove it (libvirtd looks
  # for qemu-img once, at start, then fails every snapshot with "unable to
  # find qemu-img"). So qemu-utils goes in the same transaction, at the
  # version qemu-system-common gets.
  local qemu
  qemu=$(apt-cache policy qemu-system-common | awk '/Candidate:/ {print $2}')
  local wanted=()
  for p in "${missing[@]}"; do [ "$p" = qemu-utils ] || wanted+=("$p"); done
  wanted+=("qemu-utils${qemu:+=$qemu}")
  log "installing ${wanted[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-downgrades --no-install-recommends "${wanted[@]}" >/dev/null
  [ "$created" = 1 ] && rm -f /usr/sbin/policy-rc.d
  command -v qemu-img >/dev/null || { log "qemu-img is missing after the install"; return 1; }
  return 0
}

running() { pgrep -x "$1" >/dev/null; }

start_libvirt() {
  local conf=/etc/libvirt/libvirtd.conf
  # Without polkit/D-Bus, group-based socket access is the way in.
  for line in 'unix_sock_group = "libvirt"' 'unix_sock_rw_perms = "0770"' 'unix_sock_ro_perms = "0777"' \
              'auth_unix_rw = "none"' 'auth_unix_ro = "none"'; do
    grep -qxF "$line" "$conf" || echo "$line" >> "$conf"
  done
  # Hardware virtualisation is usually absent here; /dev/kvm access as udev would set it.
  [ -e /dev/kvm ] && { chgrp kvm /dev/kvm 2>/dev/null || true; chmod 0660 /dev/kvm 2>/dev/null || true; }
  running virtlogd || virtlogd -d
  running virtlockd || virtlockd -d
  running libvirtd || libvirtd -d
  for _ in $(seq 50); do [ -S /var/run/libvirt/libvirt-sock ] && break; sleep 0.1; done
  [ -S /var/run/libvirt/libvirt-sock ] || { log "libvirtd did not create its socket"; return 1; }
  if ! virsh -c qemu:///system pool-info default >/dev/null 2>&1; then
    mkdir -p /var/lib/libvirt/images
    virsh -c qemu:///system pool-define-as default dir --target /var/lib/libvirt/images >/dev/null
  fi
  # (No `| grep -q` here: under pipefail, grep closing the pipe early fails the pipeline.)
  local info
  info=$(virsh -c qemu:///system pool-info default)
  [[ "$info" == *running* ]] || virsh -c qemu:///system pool-start default >/dev/null
}

setup_user() {
  id "$USER_NAME" >/dev/null 2>&1 || useradd -m -s /bin/sh -G libvirt "$USER_NAME"
  usermod -aG libvirt "$USER_NAME"
  # sshd without PAM refuses a locked account ("!"); "*" means no password, not locked.
  usermod -p '*' "$USER_NAME"
  mkdir -p "$BED"
  [ -f "$BED/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C epo-kvm-testbed -f "$BED/id_ed25519"
  local home
  home=$(getent passwd "$USER_NAME" | cut -d: -f6)
  install -d -m 700 -o "$USER_NAME" "$home/.ssh"
  install -m 600 -o "$USER_NAME" "$BED/id_ed25519.pub" "$home/.ssh/authorized_keys"
}

start_sshd() {
  [ -f "$BED/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$BED/ssh_host_ed25519_key"
  mkdir -p /run/sshd
  : > "$BED/known_hosts"
  for port in "${PORTS[@]}"; do
    cat > "$BED/sshd_$port.conf" <<CONF
Port $port
ListenAddress 127.0.0.1
HostKey $BED/ssh_host_ed25519_key
PidFile $BED/sshd_$port.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
AllowUsers $USER_NAME
UsePAM no
AllowStreamLocalForwarding yes
# OpenSSH refuses direct-streamlocal (the libvirt socket) when this is "no".
AllowTcpForwarding local
X11Forwarding no
ClientAliveInterval 5
CONF
    if [ ! -f "$BED/sshd_$port.pid" ] || ! kill -0 "$(cat "$BED/sshd_$port.pid")" 2>/dev/null; then
      /usr/sbin/sshd -f "$BED/sshd_$port.conf"
    fi
    echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$BED/ssh_host_ed25519_key.pub")" >> "$BED/known_hosts"
  done
}

start_bridge() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$SUBNET.1/24" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up
  if [ ! -f "$BED/dnsmasq.pid" ] || ! kill -0 "$(cat "$BED/dnsmasq.pid")" 2>/dev/null; then
    dnsmasq --conf-file=/dev/null --interface="$BRIDGE" --bind-interfaces --except-interface=lo \
      --dhcp-range="$SUBNET.10,$SUBNET.200,1h" --dhcp-leasefile="$BED/dnsmasq.leases" \
      --pid-file="$BED/dnsmasq.pid" --port=0 --no-ping
  fi
}

write_env() {
  cat > "$BED/env" <<ENV
EPO_KVM_SSH_KEY=$BED/id_ed25519
EPO_KVM_KNOWN_HOSTS=$BED/known_hosts
EPO_KVM_USER=$USER_NAME
EPO_KVM_HOST_A=127.0.0.1:${PORTS[0]}
EPO_KVM_HOST_B=127.0.0.1:${PORTS[1]}
EPO_KVM_SSHD_A_PID_FILE=$BED/sshd_${PORTS[0]}.pid
EPO_KVM_SSHD_A_CONFIG=$BED/sshd_${PORTS[0]}.conf
EPO_KVM_BRIDGE=$BRIDGE
EPO_KVM_BRIDGE_ADDRESS=$SUBNET.1
ENV
  chmod 644 "$BED/env"
  echo "$BED/env"
}

down() {
  for pidfile in "$BED"/sshd_*.pid "$BED/dnsmasq.pid"; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  pkill -x libvirtd 2>/dev/null || true
  pkill -x virtlockd 2>/dev/null || true
  pkill -x virtlogd 2>/dev/null || true
  rm -f "$BED/env"
  log "down"
}

case "${1:-up}" in
  up)
    [ "$(id -u)" -eq 0 ] || { log "needs root (it installs packages and starts daemons)"; exit 1; }
    install_packages
    start_libvirt
    setup_user
    start_sshd
    start_bridge
    write_env
    ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
