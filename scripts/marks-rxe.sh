#!/usr/bin/env bash
# Where a verbs round trip's time goes, workload against workload, in the
# rxe guest: the latency-marks segments of several `bench` workloads run in
# turn in one guest boot.
#
#   scripts/marks-rxe.sh [--bin PATH] [--workloads send,raw-smbd,raw-send]
#                        [--rounds N] [--size BYTES] [--iterations N]
#
# Why: scripts/bench.sh --rxe-vm says how far `send` sits from
# ib_send_lat, not where the difference goes. A build with the
# `latency-marks` feature stamps the TSC at seven points of every QD-1
# round trip (dataplane/src/marks.rs) and `bench` prints each segment's
# median. In the guest only the segments whose two stamps are taken on the
# same vCPU can be read (the guest marks its TSCs unsynchronised, see
# docs/bench-results.md, session 30): "client post" and "server post" (our
# post and the whole doorbell system call, in which rxe's requester, the
# loopback and the peer's responder run), "server proc" (the worker: the
# receive's completion to the reply's post), "client proc", "runner to
# next", and the round trip start to start. The figures move by tens of
# percent between runs with the host's load, so the workloads take turns
# (the order rotates every round) and the medians over the rounds are
# printed, with each workload's per-round round trip over the first's.
#
# Needs the rxe-vm rig (../shared/rxe-vm). Without --bin it builds the
# marks binary first (`cargo build --release --features latency-marks
# --target-dir target/marks`). About 20 s per round at the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=
workloads=send,raw-smbd,raw-send
rounds=10
size=512
iterations=3000
while [ $# -gt 0 ]; do
	case $1 in
	--bin) bin=$2; shift 2 ;;
	--workloads) workloads=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--size) size=$2; shift 2 ;;
	--iterations) iterations=$2; shift 2 ;;
	-h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
	*) echo "marks-rxe.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
case $rounds in '' | *[!0-9]* | 0) echo "marks-rxe.sh: --rounds needs a positive count" >&2; exit 2 ;; esac
if [ -z "$bin" ]; then
	cargo build --release --locked --features latency-marks --target-dir target/marks >&2
	bin=target/marks/release/smbdirectd
fi
[ -x "$bin" ] || { echo "marks-rxe.sh: $bin not found" >&2; exit 1; }
bin=$(realpath "$bin")
RXEVM=${RXEVM:-$PWD/../shared/rxe-vm/run-in-rxe-vm.sh}
[ -x "$RXEVM" ] || RXEVM=/work/shared/rxe-vm/run-in-rxe-vm.sh
[ -x "$RXEVM" ] || { echo "marks-rxe.sh: rxe-vm not available (set RXEVM to run-in-rxe-vm.sh)" >&2; exit 1; }

work=$(mktemp -d /tmp/marks-rxe.XXXXXX)
trap 'rm -rf "$work"' EXIT
IFS=, read -r -a ws <<<"$workloads"

# In the guest: one line per run, "WORKLOAD ROUND SEGMENT=CYCLES ...".
cat >"$work/guest.sh" <<EOF
#!/bin/bash
set -u
ws=(${ws[*]})
n=\${#ws[@]}
for r in \$(seq $rounds); do
	for k in \$(seq 0 \$((n - 1))); do
		w=\${ws[\$(( (k + r) % n ))]}
		out=\$($bin bench --provider verbs --loopback --listen \$RXE_IP:0 --workload \$w \\
			--size $size --iterations $iterations --warmup 0 --quiet 2>&1) ||
			{ echo "\$w failed:" >&2; echo "\$out" | tail -20 >&2; exit 1; }
		echo "\$out" | awk -v w=\$w -v r=\$r '
			/^  (client post|server proc|server post|client proc|runner to next) / {
				seg = \$1 "-" \$2; if (\$1 == "runner") seg = "runner"
				for (i = 1; i <= NF; i++) if (\$i == "p50") v[seg] = \$(i + 1)
			}
			/median round trip/ { v["round-trip"] = \$NF }
			END {
				if (!("round-trip" in v)) { print "no latency marks in the output: is " w " stamped, and the binary a latency-marks build?" > "/dev/stderr"; exit 1 }
				printf "%s %s", w, r; for (s in v) printf " %s=%s", s, v[s]; printf "\n"
			}' || exit 1
	done
done
EOF
chmod +x "$work/guest.sh"
echo "marks-rxe.sh: $size B, ${ws[*]}, $rounds rounds of $iterations round trips each, in the rxe guest..." >&2
flock /tmp/rxe-vm.lock "$RXEVM" --timeout $((600 + rounds * ${#ws[@]} * 30)) -- "$work/guest.sh" >"$work/runs" 2>"$work/guest.err" || {
	echo "marks-rxe.sh: the guest run failed:" >&2
	tail -30 "$work/guest.err" >&2
	exit 1
}

python3 - "$work/runs" "${ws[@]}" <<'PY'
import statistics as st, sys
path, ws = sys.argv[1], sys.argv[2:]
runs = {}
for line in open(path):
    f = line.split()
    if len(f) < 3 or f[0] not in ws:
        continue
    runs.setdefault(f[0], {})[int(f[1])] = dict((k, int(v)) for k, v in (x.split("=") for x in f[2:]))
segs = ["client-post", "server-proc", "server-post", "client-proc", "runner", "round-trip"]
print(f"\nMedian TSC cycles per segment over the rounds (same-vCPU segments only):\n")
print("| workload | rounds | " + " | ".join(segs) + " |")
print("|---|---|" + "---|" * len(segs))
for w in ws:
    r = runs.get(w, {})
    cells = [str(int(st.median(x[s] for x in r.values()))) if r else "-" for s in segs]
    print(f"| {w} | {len(r)} | " + " | ".join(cells) + " |")
base = runs.get(ws[0], {})
for w in ws[1:]:
    r = runs.get(w, {})
    q = sorted(r[k]["round-trip"] / base[k]["round-trip"] for k in r if k in base)
    if q:
        print(f"\n{w} / {ws[0]} round trip, per round: median {st.median(q):.3f} "
              f"(range {q[0]:.2f}-{q[-1]:.2f}, {sum(x < 1 for x in q)} of {len(q)} below 1)")
PY
