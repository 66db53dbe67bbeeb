#!/usr/bin/env bash
# An A/B of two variants of a code path, alternated within each run, in
# the rxe guest (or on this host with --host).
#
#   scripts/ab-rxe.sh [--bin PATH] [--workload send] [--size BYTES]
#                     [--runs N] [--iterations N] [--host]
#
# Why: in the Soft-RoCE guest a run's p50 sits in a regime that lasts the
# run and moves by up to a half between runs of the same binary, so runs of
# two builds taken in turn cannot show a change of a few percent (see
# dataplane/src/ab.rs). A build with the `ab-phases` feature flips one
# switch every 100 measured operations and `bench` reports the p50 of the
# operations run under each variant; code under experiment asks
# `smbdirect_dataplane::ab::variant_b()` where its variants part (a
# throw-away diff; variant A is the code with the switch off). This script
# runs `bench --loopback --provider verbs` (`soft` with --host) --runs
# times in one guest boot and prints every run's two p50s, the median of
# the per-run B/A ratios, and in how many runs B was below A.
#
# Needs the rxe-vm rig (../shared/rxe-vm) unless --host. Without --bin it
# builds the A/B binary first (`cargo build --release --features ab-phases
# --target-dir target/ab`, from the working tree with the experiment's
# diff applied). About 10 s per run at the defaults in the guest.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=
workload=send
size=512
runs=10
iterations=4000
host=0
while [ $# -gt 0 ]; do
	case $1 in
	--bin) bin=$2; shift 2 ;;
	--workload) workload=$2; shift 2 ;;
	--size) size=$2; shift 2 ;;
	--runs) runs=$2; shift 2 ;;
	--iterations) iterations=$2; shift 2 ;;
	--host) host=1; shift ;;
	-h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
	*) echo "ab-rxe.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
case $runs in '' | *[!0-9]* | 0) echo "ab-rxe.sh: --runs needs a positive count" >&2; exit 2 ;; esac
case $iterations in '' | *[!0-9]* | 0) echo "ab-rxe.sh: --iterations needs a positive count" >&2; exit 2 ;; esac
if [ -z "$bin" ]; then
	cargo build --release --locked --features ab-phases --target-dir target/ab >&2
	bin=target/ab/release/smbdirectd
fi
[ -x "$bin" ] || { echo "ab-rxe.sh: $bin not found" >&2; exit 1; }
bin=$(realpath "$bin")

work=$(mktemp -d /tmp/ab-rxe.XXXXXX)
trap 'rm -rf "$work"' EXIT

# One line per run: "RUN A_NS B_NS", from bench's "ab-phases:" line.
if [ $host = 1 ]; then
	target="--provider soft" where="this host (soft provider)"
else
	target="--provider verbs --listen \$RXE_IP:0" where="the rxe guest (verbs)"
fi
cat >"$work/runs.sh" <<EOF
#!/bin/bash
set -u
for r in \$(seq $runs); do
	out=\$($bin bench $target --loopback --workload $workload --size $size \\
		--iterations $iterations --warmup 0 --quiet 2>&1) ||
		{ echo "run \$r failed:" >&2; echo "\$out" | tail -20 >&2; exit 1; }
	line=\$(echo "\$out" | grep 'ab-phases:') ||
		{ echo "no ab-phases line in the output: is $bin built with --features ab-phases?" >&2; exit 1; }
	echo "\$line" | awk -v r=\$r '{ for (i = 1; i < NF; i++) { if (\$i == "A" && \$(i+1) == "p50") a = \$(i+2); if (\$i == "B" && \$(i+1) == "p50") b = \$(i+2) } print r, a, b }'
done
EOF
chmod +x "$work/runs.sh"
echo "ab-rxe.sh: $workload $size B, $runs runs of $iterations round trips in $where..." >&2
if [ $host = 1 ]; then
	"$work/runs.sh" >"$work/out"
else
	RXEVM=${RXEVM:-$PWD/../shared/rxe-vm/run-in-rxe-vm.sh}
	[ -x "$RXEVM" ] || RXEVM=/work/shared/rxe-vm/run-in-rxe-vm.sh
	[ -x "$RXEVM" ] || { echo "ab-rxe.sh: rxe-vm not available (set RXEVM to run-in-rxe-vm.sh)" >&2; exit 1; }
	flock /tmp/rxe-vm.lock "$RXEVM" --timeout $((300 + runs * 60)) -- "$work/runs.sh" >"$work/out" 2>"$work/err" || {
		echo "ab-rxe.sh: the guest run failed:" >&2
		tail -30 "$work/err" >&2
		exit 1
	}
fi

python3 - "$work/out" <<'PY'
import statistics as st, sys
rows = [tuple(int(x) for x in l.split()) for l in open(sys.argv[1]) if len(l.split()) == 3]
if not rows:
    sys.exit("ab-rxe.sh: no runs reported")
print("\n| run | A p50 (ns) | B p50 (ns) | B/A |")
print("|---|---|---|---|")
q = []
for r, a, b in rows:
    q.append(b / a)
    print(f"| {r} | {a} | {b} | {b / a:.3f} |")
s = sorted(q)
print(f"\nB/A per run: median {st.median(q):.3f} (range {s[0]:.3f}-{s[-1]:.3f}; "
      f"B below A in {sum(x < 1 for x in q)} of {len(q)} runs)")
PY
