#!/usr/bin/env bash
# A tiny bootable guest disk image, built from Debian packages only, for the
# kvm provider's end-to-end test: Debian's kernel + a busybox initramfs that
# finds the NoCloud seed (cdrom labelled `cidata`), takes a DHCP lease, runs
# qemu-ga on the virtio-serial channel and a shell-script user-data; tinyproxy
# is on board so user-data can turn the guest into a real proxy. The disk is a
# FAT file system made bootable for BIOS (syslinux) and UEFI (syslinux.efi).
#
#   tests/guest-image.sh OUT_DIR   writes OUT_DIR/epo-guest.qcow2, prints its path
#
# Logs go to stderr. Downloaded .debs and the finished image are cached under
# $EPO_GUEST_CACHE (default /var/cache/epo-guest-image), keyed on this script
# and the package versions it uses: an unchanged run only copies the image.
# Needs root (apt-get, mknod, chown in the initramfs tree).
set -euo pipefail

OUT_DIR=${1:?usage: $0 OUT_DIR}
CACHE=${EPO_GUEST_CACHE:-/var/cache/epo-guest-image}
IMAGE_NAME=epo-guest.qcow2

# Modules the guest loads (their dependencies are added, built-ins skipped):
# virtio transport + disk/NIC/serial-channel/RNG; the seed is a read-only SATA
# cdrom on q35 (AHCI), mounted as iso9660 (Joliet names need an NLS table);
# udhcpc needs packet sockets (af_packet, built into Debian's kernel).
GUEST_MODULES=(virtio_pci virtio_blk virtio_net virtio_console virtio_rng ahci sr_mod cdrom isofs nls_utf8 af_packet)
# Tools on the build host (cheap, no daemons).
HOST_PACKAGES=(syslinux syslinux-common syslinux-efi mtools dosfstools cpio kmod qemu-utils gzip)
# Extracted with dpkg-deb, never installed on the host (no kernel, no agent
# service, and busybox-static would conflict with a host's busybox).
GUEST_DEBS=(busybox-static qemu-guest-agent tinyproxy-bin)

log() { echo "guest-image: $*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (installs packages, builds an initramfs with device nodes)"

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# apt-cache here is configured without its binary cache (pkgcache ""), which
# makes every call re-parse the lists (~1 s); keep one of our own.
aptc() { apt-cache -o Dir::Cache::pkgcache="$CACHE/apt/pkgcache.bin" -o Dir::Cache::srcpkgcache= "$@"; }

APT_UPDATED=0
apt_update_once() { [ "$APT_UPDATED" = 1 ] || { apt-get update -qq >&2; APT_UPDATED=1; }; }

install_packages() {
  local missing=() p
  for p in "$@"; do installed "$p" || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  # Keep package scripts from starting any daemon (no systemd here either).
  local created=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; created=1; fi
  apt_update_once
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ "$created" = 1 ] && rm -f /usr/sbin/policy-rc.d
  return 0
}

# Candidate version of a package; refreshes the package lists once if apt
# does not know it (a fresh machine may have none).
candidate() {
  local v
  v=$(aptc policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')
  if [ -z "$v" ] || [ "$v" = "(none)" ]; then
    apt_update_once
    v=$(aptc policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')
  fi
  [ -n "$v" ] && [ "$v" != "(none)" ] || die "no candidate for package $1"
  echo "$v"
}

# Path of the cached .deb of PKG at its candidate version, downloading it once.
# A failed download (stale package lists: the mirror moved on) refreshes the
# lists and tries again with the new candidate.
deb_path() {
  local pkg=$1 ver dir f tmp attempt
  for attempt in 1 2; do
    ver=$(candidate "$pkg")
    dir="$CACHE/debs/${pkg}_${ver//:/%3a}"
    f=$(find "$dir" -maxdepth 1 -name '*.deb' 2>/dev/null | head -n1)
    [ -n "$f" ] && { echo "$f"; return 0; }
    log "downloading $pkg $ver"
    tmp=$(mktemp -d "$CACHE/debs/.dl.XXXXXX")
    # apt drops privileges to _apt for downloads; let it write there.
    chown _apt "$tmp" 2>/dev/null || true
    if (cd "$tmp" && apt-get download -qq "$pkg=$ver" >&2); then
      mkdir -p "$dir"; mv "$tmp"/*.deb "$dir/"; rm -rf "$tmp"
      find "$dir" -maxdepth 1 -name '*.deb' | head -n1
      return 0
    fi
    rm -rf "$tmp"
    [ "$attempt" = 1 ] && apt-get update -qq >&2
  done
  die "cannot download $pkg"
}

# Package names from a .deb's Depends (first alternative, no versions).
deb_depends() {
  dpkg-deb -f "$1" Depends | tr ',' '\n' | sed -E 's/\|.*//; s/\(.*\)//; s/:any//; s/[[:space:]]//g' | grep -v '^$' || true
}

mkdir -p "$CACHE/debs" "$CACHE/images" "$CACHE/apt" "$OUT_DIR"
# CI may call this concurrently; one builder at a time per cache.
exec 9>"$CACHE/lock"
flock 9

T0=$(date +%s.%N)
install_packages "${HOST_PACKAGES[@]}"

# The real kernel package behind the metapackage (e.g. linux-image-6.1.0-57-amd64).
KPKG=$(aptc depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
if [ -z "$KPKG" ]; then apt_update_once; KPKG=$(aptc depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}'); fi
[ -n "$KPKG" ] || die "cannot resolve linux-image-amd64 to a kernel package"

declare -A DEB
for p in "$KPKG" "${GUEST_DEBS[@]}"; do DEB[$p]=$(deb_path "$p"); done
# Drop .debs of versions (and kernel ABIs) no longer used, or the cache grows.
for d in "$CACHE"/debs/*; do
  keep=0
  for p in "${!DEB[@]}"; do [ "$d" = "$(dirname "${DEB[$p]}")" ] && keep=1; done
  [ "$keep" = 1 ] || rm -rf "$d"
done

# qemu-ga and tinyproxy are dynamically linked: their libraries come from the
# host (same Debian release), so the packages providing them must be there.
RUNTIME_LIBS=()
for p in qemu-guest-agent tinyproxy-bin; do
  while read -r d; do [ -n "$d" ] && RUNTIME_LIBS+=("$d"); done < <(deb_depends "${DEB[$p]}")
done
install_packages "${RUNTIME_LIBS[@]}"

# Cache key: this script, the .debs, and the host packages whose files land in the image.
KEY=$( {
  sha256sum < "${BASH_SOURCE[0]}"
  for p in "${!DEB[@]}"; do basename "${DEB[$p]}"; done | sort
  dpkg-query -W -f='${Package} ${Version}\n' "${HOST_PACKAGES[@]}" "${RUNTIME_LIBS[@]}" | sort
} | sha256sum | cut -c1-16)
CACHED="$CACHE/images/$KEY/$IMAGE_NAME"
OUT="$OUT_DIR/$IMAGE_NAME"

publish() {
  cp "$CACHED" "$OUT.tmp.$$" && mv -f "$OUT.tmp.$$" "$OUT"
  echo "$OUT"
}

if [ -f "$CACHED" ]; then
  log "cached image $KEY ($(du -h "$CACHED" | cut -f1))"
  publish
  exit 0
fi

log "building image $KEY (kernel $KPKG)"
# Scratch space on tmpfs when there is room: unpacking ~370 MB of modules
# and deleting them again costs seconds on a disk.
TMP_BASE="$CACHE"
if [ -d /dev/shm ] && [ -w /dev/shm ] && [ "$(df -Pk /dev/shm | awk 'NR==2 {print $4}')" -gt 1048576 ]; then TMP_BASE=/dev/shm; fi
WORK=$(mktemp -d "$TMP_BASE/epo-guest-build.XXXXXX")
KERNEL_UNPACK=""
trap '[ -n "$KERNEL_UNPACK" ] && kill "$KERNEL_UNPACK" 2>/dev/null; rm -rf "$WORK"' EXIT
K="$WORK/kernel" R="$WORK/root"
mkdir -p "$K" "$R"

# --- kernel -------------------------------------------------------------------
# Unpacking the kernel (xz, ~3 s) runs beside the userland assembly below.
# Only the parts we use; the whole package is ~400 MB unpacked.
dpkg-deb --fsys-tarfile "${DEB[$KPKG]}" | tar -x -C "$K" --wildcards \
  './boot/vmlinuz-*' './lib/modules/*/modules.builtin' './lib/modules/*/kernel/drivers/*' \
  './lib/modules/*/kernel/fs/*' './lib/modules/*/kernel/net/*' './lib/modules/*/kernel/lib/*' \
  './lib/modules/*/kernel/crypto/*' './lib/modules/*/kernel/arch/*' &
KERNEL_UNPACK=$!

# --- userland -----------------------------------------------------------------
mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,run,tmp,root,var/log,usr/share,lib64,lib/x86_64-linux-gnu}
chmod 1777 "$R/tmp"
ln -s ../run "$R/var/run"
dpkg-deb --fsys-tarfile "${DEB[busybox-static]}" | tar -x -O ./bin/busybox > "$R/bin/busybox"
chmod 755 "$R/bin/busybox"
for a in $("$R/bin/busybox" --list); do [ -e "$R/bin/$a" ] || ln -s busybox "$R/bin/$a"; done
# ash covers the simple bash scripts cloud images usually get as user-data.
ln -s busybox "$R/bin/bash"

X="$WORK/x"; mkdir -p "$X"
dpkg-deb -x "${DEB[qemu-guest-agent]}" "$X"
dpkg-deb -x "${DEB[tinyproxy-bin]}" "$X"
install -m 755 "$X/usr/sbin/qemu-ga" "$R/usr/sbin/qemu-ga"
install -m 755 "$X/usr/bin/tinyproxy" "$R/usr/bin/tinyproxy"
cp -r "$X/usr/share/tinyproxy" "$R/usr/share/tinyproxy"   # its error-page templates
# Shared libraries and the loader, as the host resolves them (same release).
for bin in "$R/usr/sbin/qemu-ga" "$R/usr/bin/tinyproxy"; do
  # (also catches "version `GLIBC_…' not found": a host older than the package)
  if ldd "$bin" 2>&1 | grep -q 'not found'; then ldd "$bin" >&2 || true; die "unresolved libraries for $bin"; fi
  for lib in $(ldd "$bin" | grep -oE '/[^ ]+'); do
    case "$lib" in
      */ld-linux-x86-64.so.2) cp -L "$lib" "$R/lib64/ld-linux-x86-64.so.2" ;;
      *) cp -L "$lib" "$R/lib/x86_64-linux-gnu/${lib##*/}" ;;
    esac
  done
done

# Accounts tinyproxy drops to (User nobody / Group nogroup); files-only NSS.
cat > "$R/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat > "$R/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n' > "$R/etc/nsswitch.conf"
printf '127.0.0.1 localhost\n::1 localhost\n' > "$R/etc/hosts"
mkdir -p "$R/etc/tinyproxy" "$R/var/log/tinyproxy"
chown 65534:65534 "$R/var/log/tinyproxy"
# Busybox init as the final PID 1: reaps orphans, respawns a console shell.
cat > "$R/etc/inittab" <<'EOF'
::respawn:/bin/cttyhack /bin/sh -l
::ctrlaltdel:/bin/reboot
EOF
printf 'export PATH=/bin:/sbin:/usr/bin:/usr/sbin\nexport PS1="epo-guest# "\n' > "$R/etc/profile"
# The kernel opens /dev/console for /init before anything is mounted.
mknod -m 600 "$R/dev/console" c 5 1
mknod -m 666 "$R/dev/null" c 1 3

# udhcpc hands the lease to this script (Debian's default script isn't here).
cat > "$R/etc/udhcpc.script" <<'EOF'
#!/bin/sh
# udhcpc env: interface, ip, mask (prefix length), router, dns, lease.
log() { echo "epo-init [$(cut -d' ' -f1 /proc/uptime)]: udhcpc: $*" > /dev/console; }
case "$1" in
  deconfig)
    ip -4 addr flush dev "$interface"
    ip link set "$interface" up ;;
  bound|renew)
    # On a new lease forget the old address; a renewal keeps it.
    [ "$1" = bound ] && ip -4 addr flush dev "$interface"
    ip addr replace "$ip/${mask:-24}" dev "$interface"
    for r in $router; do ip route replace default via "$r" dev "$interface"; break; done
    : > /etc/resolv.conf
    for d in $dns; do echo "nameserver $d" >> /etc/resolv.conf; done
    log "$1 $interface $ip/${mask:-24} router ${router:-none} lease ${lease:-?}s" ;;
  leasefail|nak)
    log "$1 on $interface" ;;
esac
exit 0
EOF
chmod 755 "$R/etc/udhcpc.script"

cat > "$R/init" <<'EOF'
#!/bin/sh
# epo guest init: a minimal NoCloud guest. Every step logs to the console so a
# failing boot can be read from the serial log.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root
# Uptime on every line: the serial log then shows where a slow boot spends its time.
log() { echo "epo-init [$(cut -d' ' -f1 /proc/uptime 2>/dev/null)]: $*"; }

mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
mkdir -p /dev/pts /dev/shm /run/cidata
mount -t devpts devpts /dev/pts
log "started; kernel $(uname -r)"

# 1. drivers, dependencies first (order computed at build time).
for m in $(cat /lib/modules/load-order); do
  insmod "/lib/modules/$(uname -r)/$m.ko" 2>/dev/null || log "insmod $m failed (already loaded?)"
done
log "modules loaded: $(tr '\n' ' ' < /lib/modules/load-order)"
ip link set lo up
hostname epo-guest

# 2. qemu-ga on the virtio-serial port named org.qemu.guest_agent.0. mdev
# would not create /dev/virtio-ports/<name>; the name is in sysfs. In the
# background, so a domain without the channel does not hold up the boot.
agent_port() {
  i=0
  while [ $i -lt 50 ]; do
    for p in /sys/class/virtio-ports/*; do
      [ -f "$p/name" ] && [ "$(cat "$p/name")" = org.qemu.guest_agent.0 ] && { echo "/dev/${p##*/}"; return 0; }
    done
    i=$((i + 1)); sleep 0.2
  done
  return 1
}
(
  if port=$(agent_port); then
    log "qemu-ga on $port"
    mkdir -p /run/qemu-ga
    # Respawn it: it must outlive any hiccup on the channel.
    while :; do qemu-ga -m virtio-serial -p "$port" -t /run/qemu-ga -f /run/qemu-ga.pid; log "qemu-ga exited ($?), restarting"; sleep 1; done
  else
    log "no virtio-serial port org.qemu.guest_agent.0 (no guest-agent channel?)"
  fi
) &

# 3. the NoCloud seed: an iso9660 volume labelled cidata (devices may appear late).
label_of() { dd if="$1" bs=1 skip=32808 count=32 2>/dev/null | tr -d ' \0' | tr 'a-z' 'A-Z'; }
seed=""
i=0
while [ -z "$seed" ] && [ $i -lt 35 ]; do
  for d in /dev/sr* /dev/vd* /dev/sd*; do
    [ -b "$d" ] || continue
    if [ "$(label_of "$d")" = CIDATA ] && mount -t iso9660 -o ro "$d" /run/cidata 2>/dev/null; then seed=$d; break; fi
  done
  [ -n "$seed" ] || { i=$((i + 1)); sleep 0.3; }
done
if [ -n "$seed" ]; then
  log "seed cidata from $seed: $(ls /run/cidata | tr '\n' ' ')"
  h=$(sed -n 's/^local-hostname:[[:space:]]*//p' /run/cidata/meta-data 2>/dev/null | tr -d '"'"'"' \r')
  [ -n "$h" ] && hostname "$h"
  log "instance-id: $(sed -n 's/^instance-id:[[:space:]]*//p' /run/cidata/meta-data 2>/dev/null)"
else
  log "no cidata seed found (block devices: $(ls /sys/class/block | tr '\n' ' '))"
fi

# 4. network: first ethernet interface, DHCP with busybox udhcpc.
ifc=""
i=0
while [ -z "$ifc" ] && [ $i -lt 50 ]; do
  for n in /sys/class/net/*; do
    [ "${n##*/}" != lo ] && [ "$(cat "$n/type")" = 1 ] && { ifc=${n##*/}; break; }
  done
  [ -n "$ifc" ] || { i=$((i + 1)); sleep 0.2; }
done
if [ -n "$ifc" ]; then
  log "dhcp on $ifc ($(cat /sys/class/net/$ifc/address))"
  ip link set "$ifc" up
  # Foreground until a lease (or 20 tries), then it stays in the background renewing.
  udhcpc -i "$ifc" -s /etc/udhcpc.script -x hostname:"$(hostname)" -t 20 -T 2 -b -p /run/udhcpc.pid \
    || log "udhcpc failed"
  log "addresses: $(ip -4 -o addr show dev "$ifc" | awk '{print $4}' | tr '\n' ' ')"
else
  log "no ethernet interface"
fi

# 5. user-data: only a shell script is understood here; vendor-data is ignored
# (the operator's one installs a guest agent, which this guest has built in).
[ -f /run/cidata/vendor-data ] && log "ignoring vendor-data"
if [ -f /run/cidata/user-data ]; then
  if [ "$(head -c 2 /run/cidata/user-data)" = '#!' ]; then
    cp /run/cidata/user-data /run/user-data
    chmod 700 /run/user-data
    log "running user-data"
    ( cd / && /run/user-data; log "user-data exited ($?)" ) </dev/null &
  else
    log "user-data is not a shell script (#!...); ignored"
  fi
fi

log "boot done"
# 6. stay alive: busybox init reaps orphans and respawns a shell on the console.
exec /bin/init
EOF
chmod 755 "$R/init"

# --- kernel modules -----------------------------------------------------------
wait "$KERNEL_UNPACK" || die "unpacking $KPKG failed"
KERNEL_UNPACK=""
KVER=$(basename "$(find "$K/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -n1)")
MODDIR="$K/lib/modules/$KVER"

declare -A KO BUILTIN SEEN
while read -r f; do n=${f##*/}; n=${n%%.ko*}; KO[${n//-/_}]=$f; done < <(find "$MODDIR/kernel" -name '*.ko*')
while read -r f; do n=${f##*/}; n=${n%%.ko*}; BUILTIN[${n//-/_}]=1; done < "$MODDIR/modules.builtin"
ORDER=()
# Depth-first: dependencies before the module (the guest has no modprobe/depmod data).
visit() {
  local n=${1//-/_} d
  [ -n "${SEEN[$n]:-}" ] && return 0
  SEEN[$n]=1
  [ -n "${BUILTIN[$n]:-}" ] && { log "module $n is built in"; return 0; }
  [ -n "${KO[$n]:-}" ] || die "module $n not found in $KPKG"
  for d in $(modinfo -F depends "${KO[$n]}" | tr ',' ' '); do visit "$d"; done
  ORDER+=("$n")
}
for m in "${GUEST_MODULES[@]}"; do visit "$m"; done
log "modules: ${ORDER[*]}"
mkdir -p "$R/lib/modules/$KVER"
for n in "${ORDER[@]}"; do
  case "${KO[$n]}" in
    *.ko.xz) xz -dc "${KO[$n]}" ;; *.ko.zst) zstd -qdc "${KO[$n]}" ;; *.ko.gz) gzip -dc "${KO[$n]}" ;; *) cat "${KO[$n]}" ;;
  esac > "$R/lib/modules/$KVER/$n.ko"
done
printf '%s\n' "${ORDER[@]}" > "$R/lib/modules/load-order"

log "initramfs: $(du -sh "$R" | cut -f1) uncompressed"
(cd "$R" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -n) > "$WORK/initrd.img"
cp "$(find "$K/boot" -name 'vmlinuz-*' | head -n1)" "$WORK/vmlinuz"

# --- the boot disk ----------------------------------------------------------
# One FAT file system on the whole disk (no partition table): SeaBIOS runs its
# syslinux boot sector, OVMF finds EFI/BOOT/BOOTX64.EFI on it.
cat > "$WORK/syslinux.cfg" <<'EOF'
DEFAULT epo
PROMPT 0
TIMEOUT 0
LABEL epo
  LINUX /vmlinuz
  INITRD /initrd.img
  APPEND console=ttyS0,115200n8
EOF
kb=$(( ( $(stat -c %s "$WORK/vmlinuz") + $(stat -c %s "$WORK/initrd.img") ) / 1024 ))
size_mb=$(( kb / 1024 + 3 ))
DISK="$WORK/disk.img"
truncate -s "${size_mb}M" "$DISK"
mkfs.vfat -n EPOGUEST "$DISK" >/dev/null
syslinux --install "$DISK"   # BIOS: boot sector + ldlinux.sys/ldlinux.c32 in /
export MTOOLS_SKIP_CHECK=1
mmd -i "$DISK" ::/EFI ::/EFI/BOOT
mcopy -i "$DISK" /usr/lib/SYSLINUX.EFI/efi64/syslinux.efi ::/EFI/BOOT/BOOTX64.EFI
mcopy -i "$DISK" /usr/lib/syslinux/modules/efi64/ldlinux.e64 ::/EFI/BOOT/ldlinux.e64
# syslinux (BIOS) reads /syslinux.cfg; syslinux.efi reads the one beside itself.
mcopy -i "$DISK" "$WORK/syslinux.cfg" ::/syslinux.cfg
mcopy -i "$DISK" "$WORK/syslinux.cfg" ::/EFI/BOOT/syslinux.cfg
mcopy -i "$DISK" "$WORK/vmlinuz" ::/vmlinuz
mcopy -i "$DISK" "$WORK/initrd.img" ::/initrd.img

mkdir -p "$CACHE/images/$KEY"
qemu-img convert -c -O qcow2 "$DISK" "$CACHED.tmp"
mv "$CACHED.tmp" "$CACHED"
# Only the current image is worth keeping.
find "$CACHE/images" -mindepth 1 -maxdepth 1 ! -name "$KEY" -exec rm -rf {} +
log "built in $(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')s: $(du -h "$CACHED" | cut -f1) qcow2 (disk ${size_mb} MiB, kernel $KVER)"
publish
