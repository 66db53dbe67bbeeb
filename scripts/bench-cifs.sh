#!/usr/bin/env bash
# The cifs rows of the bench matrix (scripts/bench.sh calls this hook): the
# Linux kernel client (the rig's cifs.ko, -o rdma,vers=3.1.1, unsigned)
# against smbdirectd (`serve --provider verbs`) and against ksmbd.ko, in
# one boot of the Soft-RoCE guest, same rxe0, same files, alternated
# smbdirectd, ksmbd, then ksmbd, smbdirectd, ... (the order swaps every
# pair: whichever goes first in a round does better) for --pairs pairs. Every half of
# a pair mounts, runs the same fio jobs (O_DIRECT, libaio, --runtime S after
# a 1 s ramp) and unmounts:
#   4 KiB random read QD 1 and QD 16 (IOPS), 1 MiB sequential read and
#   write QD 4 (MB/s), on a 64 MiB file (the list is BENCH_JOBS in
#   scripts/cifs-guest.sh; the guest prints it).
# Prints one Markdown row per job in bench.sh's table shape: medians of each
# side and the median of the per-pair ratios smbdirectd / ksmbd (goal >= 1).
# For the 1 MiB jobs every round also measures what one rxe queue pair moves
# with no server above it (perftest ib_write_bw / ib_read_bw, 1 MiB, fio's
# iodepth outstanding), and a row per server gives its ratio to that ceiling.
# Progress and the guest's log go to stderr and target/cifs-tests-bench/.
#
#   scripts/bench-cifs.sh --pairs 5            # ~15 min on the loaded 2-core host (TCG guest)
#   scripts/bench-cifs.sh --pairs 5 --runtime 5
#   scripts/bench-cifs.sh --pairs 7 --jobs rr4k1   # one row only (job names as above: rr4k1 rr4k16 sr1m sw1m;
#                                                  # sr1m1 sw1m1, the 1 MiB rows at QD 1, run only when named)
#   scripts/bench-cifs.sh --pairs 5 --from-log target/cifs-tests-bench/bench-cifs.log   # rows of an earlier run
#
# Without root, the rxe-vm or the kernel-smbd rig it prints one "not run"
# row and exits 0. It boots the guest through scripts/cifs-tests.sh --bench,
# which takes `flock /tmp/rxe-vm.lock` itself (do not wrap this in flock).
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."

pairs=5
runtime=5
from_log=""
jobs=""
while [ $# -gt 0 ]; do
	case "$1" in
	--pairs) pairs=$2; shift 2 ;;
	--runtime) runtime=$2; shift 2 ;;
	--jobs) jobs=$2; shift 2 ;;
	--from-log) from_log=$(cd "$here" && realpath "$2"); shift 2 ;;
	-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "bench-cifs.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
	esac
done
[[ "$pairs" =~ ^[1-9][0-9]*$ ]] || { echo "bench-cifs.sh: --pairs $pairs: want a positive count" >&2; exit 2; }
[[ "$runtime" =~ ^[1-9][0-9]*$ ]] || { echo "bench-cifs.sh: --runtime $runtime: want whole seconds" >&2; exit 2; }
[[ "$jobs" =~ ^([a-z0-9]+(,[a-z0-9]+)*)?$ ]] || { echo "bench-cifs.sh: --jobs $jobs: want names separated by commas" >&2; exit 2; }

out=target/cifs-tests-bench
mkdir -p "$out"
log=$out/bench-cifs.log
not_run() {
	echo "| cifs.ko over RDMA, fio: smbdirectd vs ksmbd.ko | - | not run ($1) | - | - | - | >= 1 | - | - |"
	exit 0
}

status=0
if [ -n "$from_log" ]; then
	log=$from_log
	status=$(sed -n 's/^cifs-tests: FAILED (exit \([0-9]*\).*/\1/p' "$log" | head -n 1)
	status=${status:-0}
else
	echo "bench-cifs: $pairs pairs, fio ${runtime} s per job; guest log in $log" >&2
	# the guest's time limit: boot, ksmbd, then per pair 2 mounts and 8 fio runs
	export BENCH_PAIRS=$pairs BENCH_RUNTIME=$runtime BENCH_ONLY=$jobs
	# (and 2 perftest runs for rxe's ceiling of the 1 MiB jobs)
	export CIFS_TESTS_TIMEOUT=${CIFS_TESTS_TIMEOUT:-$((300 + pairs * (10 * (runtime + 25) + 120)))}
	scripts/cifs-tests.sh --bench >"$log" 2>&1 || status=$?
fi
if grep -q '^cifs-tests: skipped' "$log"; then
	not_run "$(sed -n 's/^cifs-tests: skipped: //p' "$log" | head -n 1)"
fi
{ grep -E '^(bench: |OK: |FAIL: |FATAL: )' "$log" || true; } | sed 's/^/bench-cifs: /' >&2
values=$(grep -E '^bench: pair=[0-9]+ server=(smbdirectd|smbdirectd-alt|ksmbd|rxe-ceiling) job=[a-z0-9]+ value=[0-9.]+$' "$log" || true)
if [ -z "$values" ]; then
	not_run "no figures: cifs-tests.sh --bench exit $status, logs in $out"
fi
note=""
[ "$status" = 0 ] || note=" (the run reported failures: exit $status, see $log)"

median() {
	sort -g | awk '{ v[NR] = $1 } END {
		if (NR == 0) { print "nan"; exit }
		if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
value_of() { # PAIR SERVER JOB
	awk -v p="pair=$1" -v s="server=$2" -v j="job=$3" \
		'$2 == p && $3 == s && $4 == j { sub("value=", "", $5); print $5 }' <<<"$values" | tail -n 1
}

# BENCH_ALT="serve flags" (env) adds smbdirectd with those flags to every
# round, and rows for it; BENCH_ALT_BIN=PATH (env) makes that third server
# another build (e.g. the previous commit's target/release/smbdirectd
# copied aside), to compare two builds in one boot
# pair_ratios SERVER BASE JOB: as (SERVER's values), bs (BASE's) and
# ratios (SERVER / BASE per pair; a pair counts only when both halves
# measured something)
pair_ratios() {
	local p a b
	as=() bs=() ratios=()
	for ((p = 1; p <= pairs; p++)); do
		a=$(value_of "$p" "$1" "$3")
		b=$(value_of "$p" "$2" "$3")
		[ -n "$a" ] && as+=("$a")
		[ -n "$b" ] && bs+=("$b")
		if [ -n "$a" ] && [ -n "$b" ] && awk -v x="$a" -v y="$b" 'BEGIN { exit !(x > 0 && y > 0) }'; then
			ratios+=("$(awk -v x="$a" -v y="$b" 'BEGIN { printf "%.3f", x / y }')")
		fi
	done
}
ours=smbdirectd
grep -q '^bench: pair=[0-9]* server=smbdirectd-alt ' <<<"$values" && ours="smbdirectd smbdirectd-alt"
alt=$(sed -n 's/^bench-alt: //p' "$log" | head -n 1)
for srv in $ours; do
# the guest names its jobs: "bench-job: NAME iops|read_mbs|write_mbs FIO-ARGS"
while read -r _ job metric args; do
	case $metric in iops) unit=IOPS ;; *) unit=MB/s ;; esac
	label="fio $job ($unit)"
	pair_ratios "$srv" ksmbd "$job"
	ma=$(printf '%s\n' "${as[@]}" | grep . | median)
	mb=$(printf '%s\n' "${bs[@]}" | grep . | median)
	if [ ${#ratios[@]} -eq 0 ]; then
		mr=nan verdict="-"
	else
		mr=$(printf '%s\n' "${ratios[@]}" | median)
		verdict=$(awk -v r="$mr" 'BEGIN { print (r >= 1 ? "MET" : "MISSED") }')
		mr=$(printf '%.3f' "$mr")
	fi
	flags=""
	[ "$srv" = smbdirectd-alt ] && flags=" [alt: $alt]"
	echo "| cifs.ko -o rdma (rxe guest), $label: $srv vs ksmbd.ko | \`smbdirectd serve --provider verbs$flags\`, fio \`$args --direct=1 --ioengine=libaio --runtime=$runtime\` | $ma | \`ksmbd.ko\` (same mount options and files) | $mb | $mr | >= 1 | $verdict | ${ratios[*]:-none}$note |"
done < <(grep -E '^bench-job: ' "$log" | awk '!seen[$2]++')
done
# The 1 MiB jobs against what one rxe queue pair moves on its own in the
# same rounds (the guest's "rxe-ceiling": perftest's 1 MiB RDMA Writes for a
# read job, RDMA Reads for a write job, as many outstanding as fio's
# iodepth): how close each server comes to the device; no target.
while read -r _ job metric args; do
	grep -q "server=rxe-ceiling job=$job " <<<"$values" || continue
	case $metric in read_mbs) tool="ib_write_bw -t" ;; *) tool="ib_read_bw -o" ;; esac
	qd=$(sed -n 's/.*--iodepth=\([0-9]*\).*/\1/p' <<<"$args")
	for srv in $ours ksmbd; do
		pair_ratios "$srv" rxe-ceiling "$job"
		ma=$(printf '%s\n' "${as[@]}" | grep . | median)
		mc=$(printf '%s\n' "${bs[@]}" | grep . | median)
		mr=nan
		[ ${#ratios[@]} -gt 0 ] && mr=$(printf '%.3f' "$(printf '%s\n' "${ratios[@]}" | median)")
		echo "| cifs.ko -o rdma (rxe guest), fio $job (MB/s): $srv vs rxe's one-queue-pair ceiling | $srv, fio \`$args\` | $ma | perftest \`$tool $qd -s 1048576\` on rxe0, same rounds | $mc | $mr | - | - | ${ratios[*]:-none}$note |"
	done
done < <(grep -E '^bench-job: ' "$log" | awk '!seen[$2]++')
