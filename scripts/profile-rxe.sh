#!/usr/bin/env bash
# User-space instructions per `send` round trip on Soft-RoCE: ours against
# perftest's ib_send_lat, counted by callgrind inside the rxe guest.
#
#   scripts/profile-rxe.sh [--bin PATH] [--size BYTES] [--workload send|raw-smbd|raw-send] [--reps N] [--top N] [--keep DIR]
#   scripts/profile-rxe.sh --from DIR    (the profiles a --keep DIR run kept)
#
# Why: in the TCG guest of ../shared/rxe-vm every instruction is emulated,
# so the user-space work per message is a large part of the `send` row's
# gap to ib_send_lat (scripts/bench.sh --rxe-vm), and its latency figures
# move by tens of percent with the host's load. An instruction count does
# moves by a few percent at most, so a change to the send path can be
# judged in one run.
#
# How: one guest boot (under `flock /tmp/rxe-vm.lock`, like bench.sh) runs
# `valgrind --tool=callgrind` on
#   - `smbdirectd bench --provider verbs --loopback --workload send` (or
#     --workload: `raw-smbd`, `raw-send`, the bare verbs loops) (client
#     and server worker in one process, as in bench.sh's row), and
#   - ib_send_lat's server and client (two processes),
# each at two iteration counts (ours 300 and 1500, perftest 1000 and 3000).
# Start-up, connection set-up and tear-down cost about the same in every
# run of a program, so what grows with the count is what one round trip
# costs, every thread and both ends together. Busy polls that find nothing are counted too, and how many
# there are depends on how valgrind and the guest schedule the threads:
# a run where a poller spun while the thread it waited for was held up
# counts thousands more per round trip. Each run is repeated (--reps,
# default 3) and the fewest instructions at each count are taken: spinning
# only ever adds. perftest's count includes its sort of the latency samples
# after the loop (n log n, so it grows with the iterations too): it is
# printed separately and left out of its per-round-trip figure. The kernel's
# share (rxe's packet processing, the doorbell's system call) is not
# counted on either side: it is the same work for both programs.
#
# Prints the two per-round-trip figures, their ratio, and the functions of
# ours that cost the most per round trip (exclusive instructions).
# Needs valgrind on the host (`apt-get install -y valgrind`; the guest runs
# the host's binaries) and the rxe-vm rig. Takes about 8 minutes at --reps 3.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=target/release/smbdirectd
size=512
workload=send
top=25
reps=3
keep=
from=
while [ $# -gt 0 ]; do
	case $1 in
	--bin) bin=$2; shift 2 ;;
	--size) size=$2; shift 2 ;;
	--workload) workload=$2; shift 2 ;;
	--top) top=$2; shift 2 ;;
	--reps) reps=$2; shift 2 ;;
	--keep) keep=$2; shift 2 ;;
	--from) from=$2; shift 2 ;;
	-h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
	*) echo "profile-rxe.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
n1=300
n2=1500
# perftest's loop is cheap and its set-up costs the same instructions as a
# few thousand round trips: more round trips, or its fit drowns in that.
m1=1000
m2=3000
if [ -n "$from" ]; then
	p=$from
	bin="(profiles of $from)"
else
	command -v valgrind >/dev/null && command -v callgrind_annotate >/dev/null || {
		echo "profile-rxe.sh: valgrind is not installed (apt-get install -y valgrind)" >&2
		exit 1
	}
	[ -x "$bin" ] || { echo "profile-rxe.sh: $bin not found (cargo build --release)" >&2; exit 1; }
	bin=$(realpath "$bin")
	RXEVM=${RXEVM:-$PWD/../shared/rxe-vm/run-in-rxe-vm.sh}
	[ -x "$RXEVM" ] || RXEVM=/work/shared/rxe-vm/run-in-rxe-vm.sh
	[ -x "$RXEVM" ] || { echo "profile-rxe.sh: rxe-vm not available (set RXEVM to run-in-rxe-vm.sh)" >&2; exit 1; }

	work=$(mktemp -d /tmp/profile-rxe.XXXXXX)
	trap 'rm -rf "$work"' EXIT

	# The guest's writes are thrown away at power-off: the profiles come back
	# through standard output as a base64 tarball.
	cat >"$work/guest.sh" <<-EOF
	#!/bin/bash
	set -u
	out=\$(mktemp -d)
	for r in \$(seq $reps); do
	for n in $n1 $n2; do
		valgrind --tool=callgrind --fair-sched=yes --callgrind-out-file=\$out/ours-\$n.\$r \\
			$bin bench --provider verbs --listen \$RXE_IP:0 --loopback --workload $workload \\
			--size $size --iterations \$n --warmup 0 --quiet >\$out/ours.log 2>&1 ||
			{ echo "ours, \$n iterations, failed:" >&2; tail -20 \$out/ours.log >&2; exit 1; }
	done
	for n in $m1 $m2; do
		port=\$((18515 + RANDOM % 1000))
		valgrind --tool=callgrind --callgrind-out-file=\$out/pts-\$n.\$r \\
			ib_send_lat -d \$RXE_DEV -x \$RXE_GID_INDEX -s $size -n \$n -p \$port >\$out/pts.log 2>&1 &
		srv=\$!
		sleep 8
		valgrind --tool=callgrind --callgrind-out-file=\$out/ptc-\$n.\$r \\
			ib_send_lat -d \$RXE_DEV -x \$RXE_GID_INDEX -s $size -n \$n -p \$port \$RXE_IP >\$out/ptc.log 2>&1 ||
			{ echo "ib_send_lat client, \$n iterations, failed:" >&2; tail -20 \$out/ptc.log >&2; exit 1; }
		wait \$srv || { echo "ib_send_lat server failed" >&2; exit 1; }
	done
	done
	rm -f \$out/*.log
	tar czf - -C \$out . | base64 -w0
	EOF
	chmod +x "$work/guest.sh"
	echo "profile-rxe.sh: $size B $workload, callgrind in the rxe guest ($n1 and $n2 round trips of ours, $m1 and $m2 of perftest, $reps times each)..." >&2
	flock /tmp/rxe-vm.lock "$RXEVM" --timeout 1200 -- "$work/guest.sh" >"$work/b64" 2>"$work/guest.err" || {
		echo "profile-rxe.sh: the guest run failed:" >&2
		tail -30 "$work/guest.err" >&2
		exit 1
	}
	mkdir "$work/p"
	base64 -d "$work/b64" | tar xzf - -C "$work/p"
	if [ -n "$keep" ]; then mkdir -p "$keep" && cp "$work"/p/* "$keep"/; fi
	p="$work/p"
fi

# total FILE [REGEX]: instructions of the whole program, or of the
# functions (exclusive) whose name matches REGEX.
total() {
	callgrind_annotate --inclusive=no --threshold=100 "$1" 2>/dev/null | awk -v re="${2:-}" '
		/PROGRAM TOTALS/ && re == "" { gsub(",", "", $1); print $1; exit }
		/file:function/ { on = 1; next }
		on == 1 && /^ *[0-9,]+ / { seen = 1; if ($0 ~ re) { v = $1; gsub(",", "", v); s += v } ; next }
		on == 1 && seen && /^ *$/ { on = 2 }
		END { if (re != "") print s + 0 }'
}
# calls FILE REGEX: calls made to the functions whose name matches REGEX
# (from the profile's call records).
calls() {
	awk -v re="$2" '
		/^c?fn=\([0-9]+\)/ {
			id = $1; sub(/^c?fn=/, "", id)
			name = $0; sub(/^c?fn=\([0-9]+\) ?/, "", name)
			if (name != "") names[id] = name
			if ($0 ~ /^cfn=/) callee = id
			next
		}
		/^calls=/ { n = $1; sub(/^calls=/, "", n); if (names[callee] ~ re) s += n }
		END { print s + 0 }' "$1"
}
# The librxe function behind ibv_poll_cq: ours and perftest call the same
# one, so its calls count the polls of either (perftest has no symbols).
POLL_FN='^0x0000000000002ca0$'
# fit PROGRAM K: fits instructions = a + b * round trips + e * polls over
# every run of PROGRAM (both counts, every repeat: set-up and spinning
# differ from run to run, the polls say how much of it was polling) and
# prints "W e" where W = b + K * e, the instructions of a round trip whose
# K completions each took one poll and no poll came up empty.
fit() {
	local f
	for f in "$p/$1"-*; do
		local n=${f##*/$1-}
		n=${n%%.*}
		echo "$n $(calls "$f" "$POLL_FN") $(total "$f")"
	done | awk -v k="$2" '
		{ m++; x[m] = $1; q[m] = $2; y[m] = $3 }
		END {
			for (i = 1; i <= m; i++) {
				s01 += x[i]; s02 += q[i]; s11 += x[i] * x[i]; s12 += x[i] * q[i]
				s22 += q[i] * q[i]; t0 += y[i]; t1 += x[i] * y[i]; t2 += q[i] * y[i]
			}
			s00 = m
			det = s00 * (s11 * s22 - s12 * s12) - s01 * (s01 * s22 - s12 * s02) + s02 * (s01 * s12 - s11 * s02)
			if (m < 4 || det == 0 || (det < 0 ? -det : det) < 1e-9 * s11 * s22) { print "- -"; exit }
			db = s00 * (t1 * s22 - t2 * s12) - t0 * (s01 * s22 - s12 * s02) + s02 * (s01 * t2 - t1 * s02)
			de = s00 * (s11 * t2 - s12 * t1) - s01 * (s01 * t2 - t1 * s02) + t0 * (s01 * s12 - s11 * s02)
			printf "%.0f %.0f\n", db / det + k * de / det, de / det
		}'
}
# least FILES...: the run, of a program's repeats at one count, that polled
# least (for the per-function table).
least() {
	local f best= bq=
	for f in "$@"; do
		[ -e "$f" ] || continue
		local q
		q=$(calls "$f" "$POLL_FN")
		if [ -z "$bq" ] || [ "$q" -lt "$bq" ]; then best=$f bq=$q; fi
	done
	echo "$best"
}
# per_rt A B [ROUND TRIPS]: (B - A) / ROUND TRIPS (default: ours' n2 - n1).
per_rt() { awk -v a="$1" -v b="$2" -v n="${3:-$((n2 - n1))}" 'BEGIN { printf "%.0f", (b - a) / n }'; }

# Ours: 2.25 completions a round trip (each end's receive, and its Send's
# one time in 8: the endpoint signals whole-message Sends selectively,
# dataplane/src/endpoint.rs SIGNAL_EVERY; 4 before 490e925). raw-send and
# raw-smbd signal their Sends the same way (benches/src/bench/raw_send.rs).
# perftest: one per end (its receive; ib_send_lat signals a Send only every
# so many).
ours_k=2.25
read -r ours ours_e < <(fit ours "$ours_k")
read -r ptc ptc_e < <(fit ptc 1)
read -r pts pts_e < <(fit pts 1)
if [ "$ours" = - ] || [ "$ptc" = - ] || [ "$pts" = - ]; then
	echo "profile-rxe.sh: too few runs, or runs that polled alike, to separate polling from the round trips' work (--reps 3 or more)" >&2
	exit 1
fi
o1=$(least "$p/ours-$n1".*) o2=$(least "$p/ours-$n2".*)
s1=$(least "$p/pts-$m1".*) s2=$(least "$p/pts-$m2".*)
c1=$(least "$p/ptc-$m1".*) c2=$(least "$p/ptc-$m2".*)
sort_re='msort|qsort'
pt_sort=$(($(per_rt "$(total "$s1" "$sort_re")" "$(total "$s2" "$sort_re")" $((m2 - m1))) + $(per_rt "$(total "$c1" "$sort_re")" "$(total "$c2" "$sort_re")" $((m2 - m1)))))
pt=$((ptc + pts - pt_sort))
# The same estimate from each repeat's own pair of runs, with the fitted
# cost of a poll: how far one repeat can be off (set-up spins differ).
spread=$(for r in $(seq "$reps"); do
	a="$p/ours-$n1.$r" b="$p/ours-$n2.$r"
	[ -e "$a" ] && [ -e "$b" ] || continue
	awk -v t1="$(total "$a")" -v t2="$(total "$b")" -v q1="$(calls "$a" "$POLL_FN")" -v q2="$(calls "$b" "$POLL_FN")" \
		-v e="$ours_e" -v k="$ours_k" -v n=$((n2 - n1)) 'BEGIN { printf "%.0f\n", (t2 - t1 - e * (q2 - q1)) / n + k * e }'
done | sort -n | awk 'NR == 1 { lo = $1 } { hi = $1 } END { if (NR) printf "%s-%s", lo, hi }')
echo
echo "## User-space instructions per $size B send round trip (rxe guest, callgrind; $bin)"
echo
echo "| program | instructions per round trip | per empty poll |"
echo "|---|---|---|"
echo "| smbdirectd bench --workload $workload (client and server) | $ours | $ours_e |"
echo "| ib_send_lat (server and client), its sample sort left out | $pt | $pts_e (server), $ptc_e (client) |"
echo "| ib_send_lat's sample sort (left out above) | $pt_sort | |"
echo "| ratio | $(awk -v a="$ours" -v b="$pt" 'BEGIN { printf "%.2f", a / b }') | |"
echo
echo "Ours, each repeat's pair of runs alone: $spread instructions per round trip."
echo
echo "Ours, the $top costliest functions per round trip (exclusive; from the two runs that polled least, so their polling is in it):"
echo
# Per-function difference of the two runs.
diff_fns() {
	for f in "$1" "$2"; do
		callgrind_annotate --inclusive=no --threshold=100 "$f" 2>/dev/null | awk -v tag="$f" '
			/file:function/ { on = 1; next }
			on == 1 && /^ *[0-9,]+ / { seen = 1; v = $1; gsub(",", "", v); sub(/^ *[0-9,]+ +\([^)]*\) +/, ""); sub(/ \[.*$/, ""); print tag "\t" v "\t" $0; next }
			on == 1 && seen && /^ *$/ { on = 2 }'
	done | awk -F'\t' -v a="$1" -v n=$((n2 - n1)) '
		{ if ($1 == a) x[$3] -= $2; else x[$3] += $2 }
		END { for (k in x) if (x[k] / n >= 1) printf "%8.0f  %s\n", x[k] / n, k }' |
		sort -rn | head -"$top" | sed "s|$PWD/||g; s|/rustc/[0-9a-f]*/library/|std:|g"
}
diff_fns "$o1" "$o2"
