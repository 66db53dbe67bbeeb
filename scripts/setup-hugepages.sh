#!/usr/bin/env bash
# Reserve 2 MiB hugepages for smbdirectd's buffer pools (cf. SPDK scripts/setup.sh).
#
# Usage:
#   sudo [HUGEMEM=<MiB>] scripts/setup-hugepages.sh [config]   reserve and mount (default)
#   scripts/setup-hugepages.sh status                          show the current state
#   sudo scripts/setup-hugepages.sh reset                      release the reserved pages
#   scripts/setup-hugepages.sh help
#
# Environment (config):
#   HUGEMEM          MiB of 2 MiB hugepages to reserve in total (default 2048).
#   HUGENODE         Comma-separated NUMA nodes, e.g. "0" or "0,1": reserve
#                    HUGEMEM on *each* listed node (per-node sysfs).
#   HUGE_EVEN_ALLOC  "yes": split HUGEMEM evenly over all NUMA nodes.
#   HUGEPAGES_MOUNT  hugetlbfs mount point (default /dev/hugepages).
#
# The reservation is absolute, not additive: running config twice with the
# same HUGEMEM leaves the same number of pages, and an existing hugetlbfs
# mount is reused. Pages in use by a running smbdirectd are never taken away;
# reset releases only free pages and says so when some remain.
#
# smbdirectd maps its pools with MAP_HUGETLB / memfd_create(MFD_HUGETLB), so it
# needs the reserved pages but not the mount; the mount is for tools and for
# software RDMA providers that share the region through a hugetlbfs file.

set -euo pipefail

readonly PAGE_KB=2048
readonly SIZE_DIR=/sys/kernel/mm/hugepages/hugepages-${PAGE_KB}kB
readonly NODE_ROOT=/sys/devices/system/node
HUGEMEM=${HUGEMEM:-2048}
HUGENODE=${HUGENODE:-}
HUGE_EVEN_ALLOC=${HUGE_EVEN_ALLOC:-no}
HUGEPAGES_MOUNT=${HUGEPAGES_MOUNT:-/dev/hugepages}
PROG=${0##*/}

die() {
	echo "$PROG: error: $*" >&2
	exit 1
}

warn() {
	echo "$PROG: warning: $*" >&2
}

usage() {
	sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0"
}

require_root() {
	if [[ $EUID -ne 0 ]]; then
		local env=""
		[[ $1 == config ]] && env="HUGEMEM=$HUGEMEM "
		die "'$1' changes kernel settings and must run as root; try: sudo $env$0 $1"
	fi
}

require_hugetlb() {
	[[ -d $SIZE_DIR ]] ||
		die "this kernel has no ${PAGE_KB} kB hugepage support ($SIZE_DIR missing; needs CONFIG_HUGETLBFS)"
}

meminfo() { # meminfo <key> -> value
	awk -v key="$1:" '$1 == key { print $2 }' /proc/meminfo
}

nodes() { # NUMA node numbers, one per line (empty without NUMA sysfs)
	local n
	for n in "$NODE_ROOT"/node[0-9]*; do
		[[ -d $n/hugepages/hugepages-${PAGE_KB}kB ]] && echo "${n##*node}"
	done
	return 0
}

# write_pages <file> <count>: write and report a clear error when the kernel refuses.
write_pages() {
	local file=$1 count=$2
	if ! echo "$count" 2>/dev/null >"$file"; then
		die "cannot write $count to $file (read-only /sys or /proc, e.g. in an unprivileged container?)"
	fi
}

# reserve <file> <count>: set a nr_hugepages file, compacting memory once if short.
reserve() {
	local file=$1 count=$2 got
	write_pages "$file" "$count"
	got=$(<"$file")
	if ((got < count)) && [[ -w /proc/sys/vm/compact_memory ]]; then
		echo 1 >/proc/sys/vm/compact_memory 2>/dev/null || true
		write_pages "$file" "$count"
		got=$(<"$file")
	fi
	if ((got < count)); then
		warn "asked for $count pages in $file, kernel gave $got (memory too fragmented or too small);" \
			"reserve at boot instead: hugepagesz=2M hugepages=$count on the kernel command line"
		return 1
	fi
}

mount_hugetlbfs() {
	local fstype
	fstype=$(awk -v mp="$HUGEPAGES_MOUNT" '$2 == mp { t = $3 } END { print t }' /proc/mounts)
	if [[ $fstype == hugetlbfs ]]; then
		echo "hugetlbfs already mounted at $HUGEPAGES_MOUNT"
		return
	fi
	[[ -z $fstype ]] || die "$HUGEPAGES_MOUNT is already a $fstype mount, not hugetlbfs; set HUGEPAGES_MOUNT"
	mkdir -p "$HUGEPAGES_MOUNT"
	mount -t hugetlbfs -o pagesize=2M nodev "$HUGEPAGES_MOUNT" ||
		die "mounting hugetlbfs at $HUGEPAGES_MOUNT failed"
	echo "mounted hugetlbfs at $HUGEPAGES_MOUNT"
}

status() {
	require_hugetlb
	local key n
	for key in HugePages_Total HugePages_Free HugePages_Rsvd HugePages_Surp; do
		printf '%-16s %s\n' "$key:" "$(meminfo "$key")"
	done
	printf '%-16s %s kB (default size)\n' "Hugepagesize:" "$(meminfo Hugepagesize)"
	printf '%-16s %s reserved, %s free\n' "2048kB pages:" \
		"$(<"$SIZE_DIR"/nr_hugepages)" "$(<"$SIZE_DIR"/free_hugepages)"
	for n in $(nodes); do
		local d=$NODE_ROOT/node$n/hugepages/hugepages-${PAGE_KB}kB
		printf '%-16s %s reserved, %s free\n' "  node $n:" "$(<"$d"/nr_hugepages)" "$(<"$d"/free_hugepages)"
	done
	local mounts
	mounts=$(awk '$3 == "hugetlbfs" { printf "%s%s (%s)", sep, $2, $4; sep = ", " }' /proc/mounts)
	printf '%-16s %s\n' "hugetlbfs:" "${mounts:-not mounted}"
}

config() {
	require_root config
	require_hugetlb
	[[ $HUGEMEM =~ ^[0-9]+$ ]] && ((HUGEMEM > 0)) ||
		die "HUGEMEM must be a positive number of MiB, got '$HUGEMEM'"
	local pages=$(((HUGEMEM * 1024 + PAGE_KB - 1) / PAGE_KB)) ok=0 n
	if [[ -n $HUGENODE ]]; then
		for n in ${HUGENODE//,/ }; do
			[[ $n =~ ^[0-9]+$ && -d $NODE_ROOT/node$n/hugepages/hugepages-${PAGE_KB}kB ]] ||
				die "HUGENODE: NUMA node '$n' does not exist (nodes: $(nodes | paste -sd, -))"
		done
		for n in ${HUGENODE//,/ }; do
			echo "reserving $pages x 2 MiB hugepages ($HUGEMEM MiB) on node $n"
			reserve "$NODE_ROOT/node$n/hugepages/hugepages-${PAGE_KB}kB/nr_hugepages" "$pages" || ok=1
		done
	elif [[ $HUGE_EVEN_ALLOC == yes ]] && [[ -n $(nodes) ]]; then
		local all count
		mapfile -t all < <(nodes)
		count=$(((pages + ${#all[@]} - 1) / ${#all[@]}))
		for n in "${all[@]}"; do
			echo "reserving $count x 2 MiB hugepages on node $n"
			reserve "$NODE_ROOT/node$n/hugepages/hugepages-${PAGE_KB}kB/nr_hugepages" "$count" || ok=1
		done
	else
		local file=$SIZE_DIR/nr_hugepages
		# Same knob as /proc/sys/vm/nr_hugepages when 2 MiB is the default size.
		[[ $(meminfo Hugepagesize) == "$PAGE_KB" ]] && file=/proc/sys/vm/nr_hugepages
		echo "reserving $pages x 2 MiB hugepages ($HUGEMEM MiB) via $file"
		reserve "$file" "$pages" || ok=1
	fi
	mount_hugetlbfs
	status
	return $ok
}

reset() {
	require_root reset
	require_hugetlb
	local n
	for n in $(nodes); do
		write_pages "$NODE_ROOT/node$n/hugepages/hugepages-${PAGE_KB}kB/nr_hugepages" 0
	done
	write_pages "$SIZE_DIR/nr_hugepages" 0
	local left
	left=$(<"$SIZE_DIR"/nr_hugepages)
	if ((left > 0)); then
		warn "$left hugepages are still in use (is smbdirectd running?); they are freed when it exits"
	else
		echo "released all 2 MiB hugepages"
	fi
	status
}

case ${1:-config} in
config) config ;;
status) status ;;
reset) reset ;;
help | -h | --help) usage ;;
*)
	usage >&2
	die "unknown command '$1'"
	;;
esac
