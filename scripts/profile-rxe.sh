#!/usr/bin/env bash
# User-space instructions per `send` round trip on Soft-RoCE: ours against
# perftest's ib_send_lat, counted by callgrind inside the rxe guest.
#
#   scripts/profile-rxe.sh [--bin PATH] [--size BYTES] [--top N] [--keep DIR]
#   scripts/profile-rxe.sh --from DIR    (the profiles a --keep DIR run kept)
#
# Why: in the TCG guest of ../shared/rxe-vm every instruction is emulated,
# so the user-space work per message is a large part of the `send` row's
# gap to ib_send_lat (scripts/bench.sh --rxe-vm), and its latency figures
# move by tens of percent with the host's load. An instruction count does
# not: it gives the same figure on every run, so a change to the send path
# can be judged in one run.
#
# How: one guest boot (under `flock /tmp/rxe-vm.lock`, like bench.sh) runs
# `valgrind --tool=callgrind` on
#   - `smbdirectd bench --provider verbs --loopback --workload send` (client
#     and server worker in one process, as in bench.sh's row), and
#   - ib_send_lat's server and client (two processes),
# each at two iteration counts (300 and 900). Start-up, connection set-up
# and tear-down cost the same in both runs of a program, so the difference
# divided by 600 is what one round trip costs, every thread and both ends
# together. perftest's count includes its sort of the latency samples
# after the loop (n log n, so it grows with the iterations too): it is
# printed separately and left out of its per-round-trip figure. The kernel's
# share (rxe's packet processing, the doorbell's system call) is not
# counted on either side: it is the same work for both programs.
#
# Prints the two per-round-trip figures, their ratio, and the functions of
# ours that cost the most per round trip (exclusive instructions).
# Needs valgrind on the host (`apt-get install -y valgrind`; the guest runs
# the host's binaries) and the rxe-vm rig. Takes about 3 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=target/release/smbdirectd
size=512
top=25
keep=
from=
while [ $# -gt 0 ]; do
	case $1 in
	--bin) bin=$2; shift 2 ;;
	--size) size=$2; shift 2 ;;
	--top) top=$2; shift 2 ;;
	--keep) keep=$2; shift 2 ;;
	--from) from=$2; shift 2 ;;
	-h | --help) sed -n '2,33p' "$0"; exit 0 ;;
	*) echo "profile-rxe.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
n1=300
n2=900
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
	for n in $n1 $n2; do
		valgrind --tool=callgrind --fair-sched=yes --callgrind-out-file=\$out/ours-\$n \\
			$bin bench --provider verbs --listen \$RXE_IP:0 --loopback --workload send \\
			--size $size --iterations \$n --warmup 0 --quiet >\$out/ours-\$n.log 2>&1 ||
			{ echo "ours, \$n iterations, failed:" >&2; tail -20 \$out/ours-\$n.log >&2; exit 1; }
		port=\$((18515 + RANDOM % 1000))
		valgrind --tool=callgrind --callgrind-out-file=\$out/pts-\$n \\
			ib_send_lat -d \$RXE_DEV -x \$RXE_GID_INDEX -s $size -n \$n -p \$port >\$out/pts-\$n.log 2>&1 &
		srv=\$!
		sleep 15
		valgrind --tool=callgrind --callgrind-out-file=\$out/ptc-\$n \\
			ib_send_lat -d \$RXE_DEV -x \$RXE_GID_INDEX -s $size -n \$n -p \$port \$RXE_IP >\$out/ptc-\$n.log 2>&1 ||
			{ echo "ib_send_lat client, \$n iterations, failed:" >&2; tail -20 \$out/ptc-\$n.log >&2; exit 1; }
		wait \$srv || { echo "ib_send_lat server failed" >&2; exit 1; }
	done
	tar czf - -C \$out . | base64 -w0
	EOF
	chmod +x "$work/guest.sh"
	echo "profile-rxe.sh: $size B send, callgrind in the rxe guest ($n1 and $n2 round trips each)..." >&2
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
per_rt() { awk -v a="$1" -v b="$2" -v n=$((n2 - n1)) 'BEGIN { printf "%.0f", (b - a) / n }'; }

ours=$(per_rt "$(total "$p/ours-$n1")" "$(total "$p/ours-$n2")")
sort_re='msort|qsort'
pt_all=$(($(per_rt "$(total "$p/pts-$n1")" "$(total "$p/pts-$n2")") + $(per_rt "$(total "$p/ptc-$n1")" "$(total "$p/ptc-$n2")")))
pt_sort=$(($(per_rt "$(total "$p/pts-$n1" "$sort_re")" "$(total "$p/pts-$n2" "$sort_re")") + $(per_rt "$(total "$p/ptc-$n1" "$sort_re")" "$(total "$p/ptc-$n2" "$sort_re")")))
pt=$((pt_all - pt_sort))
echo
echo "## User-space instructions per $size B send round trip (rxe guest, callgrind; $bin)"
echo
echo "| program | instructions per round trip |"
echo "|---|---|"
echo "| smbdirectd bench --workload send (client and server) | $ours |"
echo "| ib_send_lat (server and client), its sample sort left out | $pt |"
echo "| ib_send_lat's sample sort (left out above) | $pt_sort |"
echo "| ratio | $(awk -v a="$ours" -v b="$pt" 'BEGIN { printf "%.2f", a / b }') |"
polls=$(per_rt "$(calls "$p/ours-$n1" 'VerbsCq as .*CompletionQueue>::poll$')" "$(calls "$p/ours-$n2" 'VerbsCq as .*CompletionQueue>::poll$')")
echo
echo "Completion-queue polls per round trip, ours (both ends; 4 find a completion): $polls"
if [ "$polls" -gt 12 ]; then
	echo
	echo "WARNING: many empty polls: the busy-poll loops ran while waiting (a loaded host slows the guest's kernel work), and their instructions are in the figure above. Run again on a quiet host."
fi
echo
echo "Ours, the $top costliest functions per round trip (exclusive):"
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
diff_fns "$p/ours-$n1" "$p/ours-$n2"
