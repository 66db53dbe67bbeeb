#!/usr/bin/env bash
# Creates a Soft-RoCE (rdma_rxe) RDMA device on an Ethernet interface, so the
# verbs provider can run on a host without an RDMA NIC:
#
#   sudo scripts/setup-soft-roce.sh [IFACE] [NAME]    # default: the default-route interface, rxe0
#   sudo scripts/setup-soft-roce.sh status
#   sudo scripts/setup-soft-roce.sh remove [NAME]
#
# Needs a kernel with rdma_rxe (CONFIG_RDMA_RXE), the ib_uverbs and rdma_ucm
# modules (for user-space verbs and rdma_cm), and `rdma` from iproute2. On a
# kernel without them it says what is missing and exits 1; the rxe VM
# (scripts/rxe-tests.sh) needs none of this on the host.
#
# Afterwards the verbs tests run on the host with RXE_IP set to the
# interface's IPv4 address (printed at the end):
#   RXE_IP=... cargo test -p smbdirect-dataplane --test verbs_runtime --test verbs_conformance
set -euo pipefail

die() { echo "setup-soft-roce: $*" >&2; exit 1; }
say() { echo "setup-soft-roce: $*"; }

need_root() { [ "$(id -u)" -eq 0 ] || die "needs root (modprobe, rdma link add)"; }
need_rdma_tool() { command -v rdma >/dev/null 2>&1 || die "the 'rdma' tool is missing: install iproute2"; }

kernel_has_rdma() {
	# The RDMA core is either built in or loadable.
	[ -d /sys/class/infiniband ] || [ -d /sys/module/ib_core ] ||
		modprobe -n -q ib_core 2>/dev/null
}

load_modules() {
	if ! kernel_has_rdma; then
		die "kernel $(uname -r) has no InfiniBand/RDMA support (no ib_core module or /sys/class/infiniband);" \
			"use a kernel with CONFIG_INFINIBAND and CONFIG_RDMA_RXE, or run the verbs tests in the rxe VM: scripts/rxe-tests.sh"
	fi
	if [ ! -d /sys/module/rdma_rxe ]; then
		modprobe rdma_rxe 2>/dev/null ||
			die "cannot load rdma_rxe: kernel $(uname -r) was built without CONFIG_RDMA_RXE (or its modules are not installed under /lib/modules/$(uname -r))"
	fi
	for m in ib_uverbs rdma_ucm; do
		[ -d "/sys/module/$m" ] || modprobe "$m" 2>/dev/null ||
			die "cannot load $m: user-space verbs (libibverbs/librdmacm) need it"
	done
}

default_iface() {
	ip -o route show default 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit }}'
}

status() {
	need_rdma_tool
	rdma link show 2>/dev/null | grep -i rxe || say "no rxe device"
}

case "${1:-}" in
-h | --help)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 0
	;;
status)
	status
	exit 0
	;;
remove)
	need_root
	need_rdma_tool
	name=${2:-rxe0}
	rdma link delete "$name" || die "cannot delete $name"
	say "removed $name"
	exit 0
	;;
esac

need_root
need_rdma_tool
iface=${1:-$(default_iface)}
name=${2:-rxe0}
[ -n "$iface" ] || die "no interface given and no default route to pick one from"
[ -e "/sys/class/net/$iface" ] || die "no network interface '$iface' (see: ip link)"
load_modules

existing=$(rdma link show 2>/dev/null | awk -v n="$iface" '$0 ~ ("netdev " n "( |$)") { sub(/\/.*/, "", $2); print $2; exit }')
if [ -n "$existing" ]; then
	say "$iface already has RDMA device $existing"
	name=$existing
else
	rdma link add "$name" type rxe netdev "$iface" ||
		die "rdma link add $name type rxe netdev $iface failed (is $iface an Ethernet device that is up?)"
	say "created $name on $iface"
fi

# Wait for the port to become active.
for _ in $(seq 1 50); do
	state=$(cat "/sys/class/infiniband/$name/ports/1/state" 2>/dev/null || true)
	case $state in *ACTIVE*) break ;; esac
	sleep 0.1
done
case ${state:-} in *ACTIVE*) ;; *) die "$name port 1 is not active (state: ${state:-unknown}); is $iface up?" ;; esac

ip4=$(ip -o -4 addr show dev "$iface" | awk '{print $4; exit}' | cut -d/ -f1)
say "$name is ACTIVE on $iface${ip4:+ with IPv4 $ip4}"
if [ -n "$ip4" ]; then
	say "run the verbs tests with: RXE_IP=$ip4 cargo test -p smbdirect-dataplane --test verbs_runtime --test verbs_conformance"
else
	say "$iface has no IPv4 address: rdma_cm needs one (ip addr add ... dev $iface)"
fi
