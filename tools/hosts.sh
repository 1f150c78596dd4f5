#!/usr/bin/env bash
# A rig of several "hosts" on one machine: each a network namespace with its own address in a
# documentation range, joined through a bridge in a namespace of its own, never through `lo`
# (a process in a host sees only that host's addresses). Optional shaping of a host's link:
# a rate cap, random loss, and a delay. Needs root, iproute2 and nftables.
#
#   tools/hosts.sh up N [SHAPE...]      # hosts h1..hN at 192.0.2.1..N/24, SHAPE on each link
#   tools/hosts.sh exec HOST CMD...     # runs CMD in HOST (h1, h2, ...)
#   tools/hosts.sh addr HOST            # HOST's address
#   tools/hosts.sh shape HOST [SHAPE...]  # sets (or, with none, clears) HOST's link's shaping
#   tools/hosts.sh link HOST up|down    # takes HOST's link down, or up again
#   tools/hosts.sh mtu HOST N           # sets HOST's link's MTU (its eth0 only: a mismatch)
#   tools/hosts.sh down                 # removes every namespace of the rig
#   tools/hosts.sh run N [SHAPE...] -- CMD...   # up, CMD (with HIXL_HOSTS=N), down on any exit
#
# SHAPE: `rate 100mbit` (a token bucket, tc tbf), `loss 5` (percent of packets dropped at
# random each way, nftables), `delay 1ms` (tc netem; in a kernel without netem, such as one
# built without CONFIG_NET_SCH_NETEM, the host's eth0 becomes a TAP device and
# tools/hosts-relay.py holds each frame for the delay). Each applies both ways: at the host's
# `eth0` and at the bridge's port towards it.
#
# Environment: HIXL_HOSTS_PREFIX (namespace names, default hx: hx-sw, hx-h1, ...; one rig per
# prefix), HIXL_HOSTS_NET (the /24, default 192.0.2).
set -euo pipefail
P=${HIXL_HOSTS_PREFIX:-hx}
NET=${HIXL_HOSTS_NET:-192.0.2}
SW=$P-sw

die() { echo "hosts: $*" >&2; exit 2; }
ns_of() {
  [[ $1 =~ ^h([0-9]+)$ ]] || die "a host is h1, h2, ...; got \"$1\""
  ip netns list | grep -qw "$P-$1" || die "no host $1 in rig $P (tools/hosts.sh up N first)"
  echo "$P-$1"
}
# The bridge's port towards host $1 (in $SW): the veth's end, or the relay's TAP while a
# delay without netem runs (hosts-relay.py).
port_of() {
  if ip -n "$SW" link show "$P-d${1#h}" >/dev/null 2>&1; then echo "$P-d${1#h}"; else echo "$P-$1"; fi
}
RUN=/run/hixl-hosts

neigh_flush() { # every host of the rig forgets the others' MAC addresses
  local n
  for n in $(ip netns list | awk '{print $1}' | grep -E "^$P-h[0-9]+$" || true); do
    ip -n "$n" neigh flush all 2>/dev/null || true
  done
}

# A delay without netem: the host's eth0 becomes a TAP device fed by tools/hosts-relay.py,
# which holds each frame for the delay; the veth waits aside (veth0) until relay_stop.
relay_start() { # relay_start HOST MS
  local h=$1 ms=$2 ns i=${1#h} n=0
  ns=$(ns_of "$h")
  ip -n "$ns" link set eth0 down
  ip -n "$ns" link set eth0 name veth0
  ip -n "$SW" link set "$P-$h" nomaster
  ip -n "$SW" link set "$P-$h" down
  mkdir -p "$RUN"
  python3 "$(dirname "$0")/hosts-relay.py" "$ns" "$SW" "$P-d$i" "$ms" \
    >"$RUN/$P-$h.relay.log" 2>&1 </dev/null &
  echo $! >"$RUN/$P-$h.relay.pid"
  until grep -q READY "$RUN/$P-$h.relay.log" 2>/dev/null; do
    kill -0 "$(cat "$RUN/$P-$h.relay.pid")" 2>/dev/null || die "the delay relay of $h failed: $(cat "$RUN/$P-$h.relay.log")"
    n=$((n + 1)); [ $n -le 100 ] || die "the delay relay of $h did not start"
    sleep 0.05
  done
  ip -n "$ns" addr add "$NET.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$SW" link set "$P-d$i" master br0 up
  neigh_flush
}

relay_stop() { # relay_stop HOST: back to the veth (nothing to do without a relay)
  local h=$1 ns i=${1#h} pid n=0
  [ -f "$RUN/$P-$h.relay.pid" ] || return 0
  ns=$(ns_of "$h")
  pid=$(cat "$RUN/$P-$h.relay.pid")
  kill "$pid" 2>/dev/null || true
  # its TAP devices go with it
  while ip -n "$ns" link show eth0 >/dev/null 2>&1 && [ $n -lt 100 ]; do sleep 0.05; n=$((n + 1)); done
  rm -f "$RUN/$P-$h.relay.pid" "$RUN/$P-$h.relay.log"
  ip -n "$ns" link set veth0 name eth0
  ip -n "$ns" addr add "$NET.$i/24" dev eth0 2>/dev/null || true
  ip -n "$ns" link set eth0 up
  ip -n "$SW" link set "$P-$h" master br0 up
  neigh_flush
}

shape() { # shape HOST [SHAPE...]
  local h=$1 ns rate="" loss="" delay="" port ms=""
  shift
  ns=$(ns_of "$h")
  while [ $# -gt 0 ]; do
    case $1 in
      rate) rate=${2:?rate needs a value, e.g. 100mbit}; shift 2 ;;
      loss) loss=${2:?loss needs a percent, e.g. 5}; shift 2 ;;
      delay) delay=${2:?delay needs a time, e.g. 1ms}; shift 2 ;;
      *) die "shape takes rate R, loss PCT and delay T; got \"$1\"" ;;
    esac
  done
  [ -z "$loss" ] || [[ $loss =~ ^[0-9]+$ && $loss -le 100 ]] || die "loss is a whole percent 0..100, got \"$loss\""
  relay_stop "$h"
  tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
  tc -n "$SW" qdisc del dev "$(port_of "$h")" root 2>/dev/null || true
  ip netns exec "$ns" nft delete table inet hxhosts 2>/dev/null || true
  local q=()
  if [ -n "$delay" ]; then
    if tc -n "$ns" qdisc add dev eth0 root netem delay "$delay" 2>/dev/null; then
      tc -n "$ns" qdisc del dev eth0 root
      q=(netem delay "$delay")
      [ -n "$rate" ] && q+=(rate "$rate")
    else
      # no netem in this kernel: the relay holds the frames, a token bucket caps the rate
      if [[ $delay =~ ^([0-9]+(\.[0-9]+)?)ms$ ]]; then ms=${BASH_REMATCH[1]}
      elif [[ $delay =~ ^([0-9]+)us$ ]]; then ms=$(awk "BEGIN{print ${BASH_REMATCH[1]}/1000}")
      else die "delay is Nms or Nus, got \"$delay\""; fi
      relay_start "$h" "$ms"
    fi
  fi
  if [ ${#q[@]} -eq 0 ] && [ -n "$rate" ]; then
    q=(tbf rate "$rate" burst 32kb latency 100ms)
  fi
  port=$(port_of "$h")
  if [ ${#q[@]} -gt 0 ]; then
    local err
    for where in "-n $ns qdisc add dev eth0" "-n $SW qdisc add dev $port"; do
      # shellcheck disable=SC2086 # where is words
      err=$(tc $where root "${q[@]}" 2>&1) || die "tc $where root ${q[*]}: $err"
    done
  fi
  if [ -n "$loss" ] && [ "$loss" -gt 0 ]; then
    ip netns exec "$ns" nft "add table inet hxhosts; \
      add chain inet hxhosts in { type filter hook input priority 0; }; \
      add chain inet hxhosts out { type filter hook output priority 0; }; \
      add rule inet hxhosts in iifname \"eth0\" numgen random mod 100 < $loss counter drop; \
      add rule inet hxhosts out oifname \"eth0\" numgen random mod 100 < $loss counter drop"
  fi
  return 0
}

down() {
  local n f
  for f in "$RUN/$P"-h*.relay.pid; do
    [ -f "$f" ] || continue
    kill "$(cat "$f")" 2>/dev/null || true
    rm -f "$f" "${f%.pid}.log"
  done
  for n in $(ip netns list | awk '{print $1}' | grep -E "^$P-(sw|h[0-9]+)$" || true); do
    ip netns del "$n" 2>/dev/null || true
  done
}

up() {
  local n=$1 i ns
  shift
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "N must be 1..200, got \"$n\""
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
  command -v ip >/dev/null || die "needs iproute2 (ip, tc)"
  down
  ip netns add "$SW"
  ip -n "$SW" link add br0 type bridge
  ip -n "$SW" link set br0 up
  ip -n "$SW" link set lo up
  for ((i = 1; i <= n; i++)); do
    ns=$P-h$i
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "$P-t$i" type veth peer name "$P-h$i"
    ip link set "$P-t$i" netns "$ns"
    ip -n "$ns" link set "$P-t$i" name eth0
    ip link set "$P-h$i" netns "$SW"
    ip -n "$SW" link set "$P-h$i" master br0 up
    ip -n "$ns" addr add "$NET.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    [ $# -gt 0 ] && shape "h$i" "$@"
  done
  return 0
}

cmd=${1:-}
[ -n "$cmd" ] && shift
case $cmd in
  up) [ $# -ge 1 ] || die "up N [SHAPE...]"; up "$@" ;;
  down) down ;;
  exec)
    [ $# -ge 2 ] || die "exec HOST CMD..."
    ns=$(ns_of "$1"); shift
    exec ip netns exec "$ns" "$@"
    ;;
  addr)
    [ $# -eq 1 ] || die "addr HOST"
    ns_of "$1" >/dev/null
    echo "$NET.${1#h}"
    ;;
  shape) [ $# -ge 1 ] || die "shape HOST [SHAPE...]"; shape "$@" ;;
  link)
    [ $# -eq 2 ] && [[ $2 =~ ^(up|down)$ ]] || die "link HOST up|down"
    ip -n "$(ns_of "$1")" link set eth0 "$2"
    ;;
  mtu)
    [ $# -eq 2 ] && [[ $2 =~ ^[0-9]+$ ]] || die "mtu HOST N (bytes, e.g. 1280)"
    ip -n "$(ns_of "$1")" link set eth0 mtu "$2"
    ;;
  run)
    [ $# -ge 3 ] || die "run N [SHAPE...] -- CMD..."
    n=$1; shift
    spec=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do spec+=("$1"); shift; done
    [ "${1:-}" = "--" ] || die "run N [SHAPE...] -- CMD..."
    shift
    trap down EXIT
    up "$n" "${spec[@]}"
    HIXL_HOSTS=$n "$@"
    ;;
  *) sed -n '2,22p' "$0"; exit 2 ;;
esac
