#!/usr/bin/env bash
# The benchmark matrix: fixed rows, each a measurement next to its baseline,
# run with the release binary's `smbdirectd bench`; prints a Markdown table
# of results, baselines and ratios (and writes it to --out FILE).
#
#   scripts/bench.sh                      # build (release), run, print
#   scripts/bench.sh --pairs 7 --duration 2 --out bench.md
#   scripts/bench.sh --cores 2,3          # client core 2, server core 3
#   scripts/bench.sh --no-build --bin target/release/smbdirectd
#
# Noise: shared machines are noisy, so each row alternates its two runs
# A B A B ... (--pairs, at least 5) and reports the median of the per-pair
# p50 ratios A/B, not a ratio of pooled numbers. Each run is a separate
# process with its own warm-up.
#
# Rows now:
#   1. SMB Direct `send` 512 B vs `raw-send` 512 B (the bare provider,
#      same cores, same runner): target p50 ratio <= 1.15.
#   2. `raw-send` 64 B (a soft-provider Send/Recv round trip) vs
#      `pingpong` (two threads bouncing one cache line on the same two
#      cores): target p50 ratio <= 3.
# Rows still to fill (printed as "not yet measured"): SMB2 READ/WRITE
# through RDMA vs raw RDMA, Storage QoS limit accuracy, and the rxe (verbs)
# rows.
set -euo pipefail
cd "$(dirname "$0")/.."

pairs=5
duration=1
warmup=0.3
out=""
bin=target/release/smbdirectd
build=1
cores=""

usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
	case "$1" in
	--pairs) pairs=$2; shift 2 ;;
	--duration) duration=$2; shift 2 ;;
	--warmup) warmup=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--bin) bin=$2; shift 2 ;;
	--no-build) build=0; shift ;;
	--cores) cores=$2; shift 2 ;;
	-h | --help) usage; exit 0 ;;
	*) echo "bench.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
	esac
done
if ! [[ "$pairs" =~ ^[0-9]+$ ]] || [ "$pairs" -lt 5 ]; then
	echo "bench.sh: --pairs $pairs: want at least 5" >&2
	exit 2
fi

if [ "$build" = 1 ]; then
	cargo build --release --quiet --bin smbdirectd
fi
if [ ! -x "$bin" ]; then
	echo "bench.sh: $bin not found (build it, or drop --no-build)" >&2
	exit 2
fi

core_args=()
if [ -n "$cores" ]; then
	IFS=, read -r client_core server_core <<<"$cores"
	if [ -z "${server_core:-}" ]; then
		echo "bench.sh: --cores wants CLIENT,SERVER" >&2
		exit 2
	fi
	core_args=(--cores "$client_core" --server-cores "$server_core")
fi

started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# p50 (us) of one run: bench --loopback ARGS, JSON to a scratch file.
p50_of() {
	local json="$tmp/run.json" log="$tmp/run.log"
	if ! "$bin" bench --loopback --provider soft "${core_args[@]}" --duration "$duration" \
		--warmup "$warmup" --quiet --json "$json" "$@" >"$log" 2>&1; then
		echo "bench.sh: smbdirectd bench $* failed:" >&2
		tail -5 "$log" >&2
		exit 1
	fi
	sed -n 's/.*"latency_us": {[^}]*"p50": \([0-9.]*\).*/\1/p' "$json"
}

median() {
	sort -g | awk '{ v[NR] = $1 } END {
		if (NR == 0) { print "nan"; exit }
		if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

rows=()

# row NAME TARGET "A args" "B args": alternates A and B, appends a table row.
row() {
	local name=$1 target=$2 a=$3 b=$4
	local as=() bs=() ratios=() i pa pb
	for ((i = 0; i < pairs; i++)); do
		# shellcheck disable=SC2086
		pa=$(p50_of $a)
		# shellcheck disable=SC2086
		pb=$(p50_of $b)
		as+=("$pa")
		bs+=("$pb")
		ratios+=("$(awk -v x="$pa" -v y="$pb" 'BEGIN { printf "%.3f", (y > 0 ? x / y : 0) }')")
		echo "bench.sh: $name pair $((i + 1))/$pairs: $pa / $pb us" >&2
	done
	local ma mb mr verdict
	ma=$(printf '%s\n' "${as[@]}" | median)
	mb=$(printf '%s\n' "${bs[@]}" | median)
	mr=$(printf '%s\n' "${ratios[@]}" | median)
	verdict=$(awk -v r="$mr" -v t="$target" 'BEGIN { print (r <= t ? "MET" : "MISSED") }')
	rows+=("| $name | \`$a\` | $ma | \`$b\` | $mb | $(printf '%.2f' "$mr") | <= $target | $verdict | ${ratios[*]} |")
}

todo() {
	rows+=("| $1 | - | not yet measured | - | - | - | $2 | TODO | - |")
}

row "SMBD send vs raw provider, 512 B, p50 round trip" 1.15 \
	"--workload send --size 512" "--workload raw-send --size 512"
row "soft Send/Recv vs cache-line ping-pong, p50 round trip" 3 \
	"--workload raw-send --size 64" "--workload pingpong"
# TODO(read/write): SMB2 READ/WRITE through an RDMA channel vs raw RDMA
# Read/Write of the same size (bench --workload read|write, and --inline).
todo "SMB2 READ 64 KiB via RDMA vs raw RDMA Write, MB/s" "TBD"
todo "SMB2 WRITE 64 KiB via RDMA vs raw RDMA Read, MB/s" "TBD"
# TODO(qos): achieved IOPS under a --limit vs the limit; reservation met.
todo "Storage QoS: achieved / --limit IOPS" "TBD"
# TODO(rxe): the same rows over --provider verbs in the Soft-RoCE guest.
todo "rxe (verbs): SMBD send vs raw-send, 512 B" "TBD"

rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
{
	echo "## smbdirectd bench matrix"
	echo
	echo "started $started, commit $rev, $(nproc) cores, provider soft, $pairs pairs of ${duration} s runs (+${warmup} s warm-up) alternating A B; ratio = median of per-pair p50(A)/p50(B)${cores:+, cores $cores}"
	echo
	echo "| row | A | A p50 (us, median) | B (baseline) | B p50 (us, median) | ratio A/B | target | verdict | per-pair ratios |"
	echo "|---|---|---|---|---|---|---|---|---|"
	printf '%s\n' "${rows[@]}"
} >"$tmp/table.md"
cat "$tmp/table.md"
if [ -n "$out" ]; then
	cp "$tmp/table.md" "$out"
fi
