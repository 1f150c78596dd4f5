#!/usr/bin/env bash
# Boots a throw-away qemu guest (TCG, no NIC, no disk) whose kernel has Soft-RoCE (rdma_rxe),
# creates rxe0 and rxe1 on two dummy netdevs and rxe2 and rxe3 on the two ends of a veth pair,
# runs one command in it and exits with that command's status.
# For running the hixl-verbs tests on hosts without RDMA in their kernel (like CI here).
#
#   tools/softroce-vm.sh deps                 # apt-get the host tools (Debian 12)
#   tools/softroce-vm.sh build [BIN...]       # kernel .deb via apt-get download, initramfs with
#                                             # busybox, rxe modules, the rxe provider, ibv_devinfo,
#                                             # and BIN... (+ their shared libs) under /extra
#   tools/softroce-vm.sh run 'CMD'            # boot, set up rxe0, run CMD with sh, power off;
#                                             # exit status = CMD's (124 on timeout, 3 if rxe0 failed)
#
# Environment: WORK (default /tmp/hixl-softroce; kernel .deb cached there), MEM (MiB, 1024),
# ROOT_FILES (build: a file of lines `PATH [GUEST_PATH]`, absolute, no blanks in them: PATH is
# copied to GUEST_PATH, default PATH, with the shared libs of an ELF file; the guest's /tmp is a
# fresh tmpfs, so a file from the host's /tmp needs another GUEST_PATH; tools/guest-python.sh),
# SMP (2), TIMEOUT (s, 900), ACCEL (tcg,thread=multi: the host's /dev/kvm, if any, is not
# relied on), GUEST_CPU (max: qemu64 lacks what numpy 2 needs). CMD runs as root in /tmp with
# /extra on PATH; its output and the guest's console are shown and kept in $WORK/run.log.
#
# Nothing is downloaded but Debian packages: the kernel image package that linux-image-amd64
# currently depends on (the -cloud flavour lacks rdma_rxe). rdma_rxe needs the "crc32" crypto
# algorithm for its ICRC, so crc32_generic is loaded first, or adding the link fails.
set -euo pipefail

WORK=${WORK:-/tmp/hixl-softroce}
MEM=${MEM:-1024}
SMP=${SMP:-2}
TIMEOUT=${TIMEOUT:-900}
ACCEL=${ACCEL:-tcg,thread=multi}
# The guest's CPU model: every feature the accelerator can give (TCG's default, qemu64, lacks
# SSE4.2 and POPCNT, and numpy 2's wheels, built for x86-64-v2, die with SIGILL on it).
GUEST_CPU=${GUEST_CPU:-max}
MODULES="crc32_generic rdma_rxe ib_uverbs dummy veth"
LIBDIR=/usr/lib/x86_64-linux-gnu

die() { echo "softroce-vm: $*" >&2; exit 2; }

deps() {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    qemu-system-x86 busybox-static ibverbs-providers ibverbs-utils iproute2 kmod cpio gzip
}

# The kernel image package, fetched once into $WORK and unpacked into $WORK/kernel.
fetch_kernel() {
  local pkg deb
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [ -n "$pkg" ] || die "cannot resolve linux-image-amd64 (run: apt-get update, or $0 deps)"
  deb=$(ls "$WORK"/"${pkg}"_*.deb 2>/dev/null | head -1 || true)
  if [ -z "$deb" ]; then
    # (as root apt warns that the download is unsandboxed; harmless here)
    (cd "$WORK" && apt-get download "$pkg" 2>&1 | grep -v unsandboxed || true)
    deb=$(ls "$WORK"/"${pkg}"_*.deb 2>/dev/null | head -1 || true)
    [ -n "$deb" ] || die "apt-get download $pkg failed"
  fi
  if [ ! -f "$WORK/kernel/.from" ] || [ "$(cat "$WORK/kernel/.from")" != "$deb" ]; then
    rm -rf "$WORK/kernel" && mkdir -p "$WORK/kernel"
    dpkg-deb -x "$deb" "$WORK/kernel"
    echo "$deb" > "$WORK/kernel/.from"
  fi
}

# Copies module $1 and, recursively, what it depends on, from the unpacked kernel into $2.
copy_module() {
  local name=$1 root=$2 kver=$3 f dep
  f=$(find "$WORK/kernel/lib/modules/$kver" -name "$name.ko*" | head -1)
  [ -n "$f" ] || f=$(find "$WORK/kernel/lib/modules/$kver" -name "${name//_/-}.ko*" | head -1)
  [ -n "$f" ] || { grep -q "/$name.ko" "$WORK/kernel/lib/modules/$kver/modules.builtin" && return 0; die "module $name not in $kver"; }
  local dest=$root/${f#"$WORK"/kernel/}
  [ -e "$dest" ] && return 0
  mkdir -p "$(dirname "$dest")" && cp "$f" "$dest"
  for dep in $(modinfo -F depends "$f" | tr ',' ' '); do copy_module "$dep" "$root" "$kver"; done
}

# Copies $1 and every shared library it loads into the tree $2, at their host paths.
copy_with_libs() {
  local bin=$1 root=$2 lib
  for lib in $(ldd "$bin" 2>/dev/null | awk '/=> \//{print $3} /^[[:space:]]*\/lib/{print $1}'); do
    [ -e "$root$lib" ] || { mkdir -p "$root$(dirname "$lib")"; cp -L "$lib" "$root$lib"; }
  done
}

# Copies each file listed in $1 (lines `PATH [GUEST_PATH]`) to GUEST_PATH (default PATH) under $2,
# with the shared libs of an ELF file.
copy_listed() {
  local list=$1 root=$2 f to
  while read -r f to; do
    [ -n "$f" ] || continue
    to=${to:-$f}
    [ -f "$f" ] || die "listed in $list, not a file: $f"
    [ -e "$root$to" ] && continue
    mkdir -p "$root$(dirname "$to")" && cp -pL "$f" "$root$to"
    if ldd "$f" >/dev/null 2>&1; then copy_with_libs "$f" "$root"; fi
  done < "$list"
}

build() {
  mkdir -p "$WORK"
  fetch_kernel
  local kver root=$WORK/root b
  kver=$(ls "$WORK/kernel/lib/modules" | head -1)
  cp "$WORK/kernel/boot/vmlinuz-$kver" "$WORK/vmlinuz"
  rm -rf "$root" && mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc/libibverbs.d,proc,sys,dev,tmp,extra,lib64,$LIBDIR/libibverbs}
  cp /bin/busybox "$root/bin/busybox"
  for m in $MODULES; do copy_module "$m" "$root" "$kver"; done
  cp "$WORK/kernel/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$root/lib/modules/$kver/"
  depmod -b "$root" "$kver"
  # userspace verbs: the rxe provider (dlopen'ed by libibverbs, so ldd of a test binary misses
  # it), its driver file, the `rdma` tool and ibv_devinfo for the log; iproute2's `ip` as
  # /usr/sbin/ip for the veth pair and its routing rules (busybox's `ip` has neither)
  cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
  cp "$LIBDIR"/libibverbs/librxe-rdmav*.so "$root/$LIBDIR/libibverbs/"
  copy_with_libs "$(ls "$LIBDIR"/libibverbs/librxe-rdmav*.so | head -1)" "$root"
  for b in "$(command -v rdma)" "$(command -v ibv_devinfo)"; do cp "$b" "$root/bin/"; copy_with_libs "$b" "$root"; done
  cp "$(command -v ip)" "$root/usr/sbin/ip"; copy_with_libs "$(command -v ip)" "$root"
  for b in "$@"; do
    [ -x "$b" ] || die "not an executable: $b"
    cp "$b" "$root/extra/"; copy_with_libs "$b" "$root"
  done
  [ -z "${ROOT_FILES:-}" ] || copy_listed "$ROOT_FILES" "$root"
  cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
  cat > "$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s
export PATH=/extra:/sbin:/bin:/usr/sbin:/usr/bin HOME=/tmp
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev; mount -t tmpfs tmp /tmp
say() { echo "SOFTROCE $* (uptime $(cut -d' ' -f1 /proc/uptime)s)"; }
ip link set lo up
modprobe crc32_generic && modprobe rdma_rxe && modprobe ib_uverbs && modprobe dummy numdummies=2
# TEST-NET-1 and TEST-NET-2 on dummy netdevs: the guest has no NIC, nothing leaves it. rxe0 is
# every test's device; rxe1 (MTU 9000: an active MTU of 4096 against rxe0's 1024) is the second
# rail of the rail tests and the other end of the MTU test.
ip addr add 192.0.2.1/24 dev dummy0 && ip link set dummy0 up
ip addr add 198.51.100.1/24 dev dummy1 && ip link set dummy1 mtu 9000 && ip link set dummy1 up
# rxe2 and rxe3, the two ends of the MTU test: on the veth pair mtu0 (203.0.113.1, MTU 1500:
# active MTU 1024) and mtu1 (203.0.113.2, MTU 9000: 4096), both in this network namespace, as
# this kernel's rdma_rxe sends and receives only in the initial one. Between two local addresses
# a packet would leave through `lo`, which no rxe device serves; so two rules, looked up before
# the local table, send what leaves from mtu0 or mtu1 out of that end (neighbours fixed, no ARP),
# and the ends accept packets from a local source. Other traffic is routed as before.
mtu_pair() {
  local ip=/usr/sbin/ip d
  modprobe veth && $ip link add mtu0 mtu 1500 type veth peer name mtu1 mtu 9000 || return 1
  $ip addr add 203.0.113.1/24 dev mtu0 && $ip addr add 203.0.113.2/24 dev mtu1 || return 1
  for d in mtu0 mtu1; do
    echo 1 > /proc/sys/net/ipv4/conf/$d/accept_local && echo 0 > /proc/sys/net/ipv4/conf/$d/rp_filter || return 1
    $ip link set $d up || return 1
  done
  $ip neigh replace 203.0.113.2 lladdr "$(cat /sys/class/net/mtu1/address)" dev mtu0 nud permanent &&
  $ip neigh replace 203.0.113.1 lladdr "$(cat /sys/class/net/mtu0/address)" dev mtu1 nud permanent &&
  $ip route add 203.0.113.2 dev mtu0 src 203.0.113.1 table 100 &&
  $ip route add 203.0.113.1 dev mtu1 src 203.0.113.2 table 101 &&
  $ip rule add pref 10 oif mtu0 lookup 100 && $ip rule add pref 10 oif mtu1 lookup 101 &&
  $ip rule add pref 100 lookup local && $ip rule del pref 0 &&
  rdma link add rxe2 type rxe netdev mtu0 && rdma link add rxe3 type rxe netdev mtu1
}
active() { n=0; until grep -q ACTIVE /sys/class/infiniband/$1/ports/1/state 2>/dev/null || [ $n -ge 50 ]; do sleep 0.1; n=$((n+1)); done; }
if rdma link add rxe0 type rxe netdev dummy0; then
  active rxe0
  if rdma link add rxe1 type rxe netdev dummy1; then active rxe1; else say "rxe1 setup failed"; fi
  if mtu_pair; then active rxe2; active rxe3; else say "rxe2/rxe3 (the MTU test's pair) setup failed"; fi
  for d in rxe0 rxe1 rxe2 rxe3; do
    ibv_devinfo -v -d $d 2>/dev/null | grep -E "hca_id|state:|active_mtu|max_mr_size|max_qp_wr|max_cqe|max_msg_sz|GID\[" | sed 's/^/  /'
  done
  say "rxe0 ready"
  cd /tmp; sh /cmd.sh; rc=$?
else
  say "rxe0 setup failed"; rc=3
fi
say "exit=$rc"
poweroff -f
INIT
  chmod +x "$root/init"
  (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$WORK/initramfs.cpio.gz"
  echo "softroce-vm: built $WORK/initramfs.cpio.gz ($(du -h "$WORK/initramfs.cpio.gz" | cut -f1), kernel $kver)"
}

run() {
  [ $# -ge 1 ] || die "usage: $0 run 'CMD'"
  [ -f "$WORK/initramfs.cpio.gz" ] || die "no initramfs; run: $0 build"
  # the command travels as a second cpio archive appended to the initramfs (the kernel unpacks
  # concatenated archives in order), so nothing has to fit on the kernel command line
  local c=$WORK/cmd
  rm -rf "$c" && mkdir -p "$c" && printf '%s\n' "$*" > "$c/cmd.sh"
  (cd "$c" && echo cmd.sh | cpio -o -H newc --quiet | gzip -1) > "$WORK/cmd.cpio.gz"
  cat "$WORK/initramfs.cpio.gz" "$WORK/cmd.cpio.gz" > "$WORK/boot.cpio.gz"
  local t0=$SECONDS rc
  set +e
  timeout "$TIMEOUT" qemu-system-x86_64 -accel "$ACCEL" -cpu "$GUEST_CPU" -smp "$SMP" -m "$MEM" -nographic -no-reboot \
    -nic none -kernel "$WORK/vmlinuz" -initrd "$WORK/boot.cpio.gz" \
    -append "console=ttyS0 panic=-1 quiet loglevel=3" < /dev/null 2>&1 | sed -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' -e 's/\x1bc//g' -e 's/\r//g' | tee "$WORK/run.log"
  rc=${PIPESTATUS[0]}
  set -e
  echo "softroce-vm: guest ran $((SECONDS - t0))s"
  [ "$rc" = 0 ] || { echo "softroce-vm: qemu exited $rc (124 = timeout after ${TIMEOUT}s)"; exit "$rc"; }
  rc=$(sed -n 's/^SOFTROCE exit=\([0-9]*\).*/\1/p' "$WORK/run.log" | tail -1)
  [ -n "$rc" ] || { echo "softroce-vm: the guest did not report an exit status"; exit 1; }
  exit "$rc"
}

cmd=${1:-}; shift || true
case "$cmd" in
  deps) deps ;;
  build) build "$@" ;;
  run) run "$@" ;;
  *) sed -n '2,24p' "$0"; exit 2 ;;
esac
