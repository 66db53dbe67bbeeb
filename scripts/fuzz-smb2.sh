#!/usr/bin/env bash
# A mutation campaign against a fresh `smbdirectd serve` on the soft
# provider: the torture cases smb2-mutated-requests and
# smb2-mutated-handshake (src/torture/cases_mutated.rs, docs/reliability.md),
# each run with a new random seed, until a run fails or the runs are done.
#
#   scripts/fuzz-smb2.sh [--runs N] [--mutations M] [--store-size SIZE]
#
# Defaults: 20 runs of 5000 requests each per case, a 4G store (mutated
# SET_INFO end-of-file requests grow files). The server knows the user the
# handshake case logs on as (--users) and accepts anonymous sessions
# (--guest-ok). On a failure it prints the failing run's seed (replay it
# with SMBDIRECTD_TORTURE_SEED=... and the same --mutations) and keeps the
# server log. At the end it checks the server held no connection, session
# or open, exited 0 on SIGTERM without a panic and gave every pool buffer
# back. Exit status: 0 when all of that held, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=20 mutations=5000 store=4G
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) runs=$2; shift 2 ;;
	--mutations) mutations=$2; shift 2 ;;
	--store-size) store=$2; shift 2 ;;
	-h | --help) sed -n '2,17p' "$0"; exit 0 ;;
	*) echo "fuzz-smb2: unknown argument $1" >&2; exit 2 ;;
	esac
done

cargo build --release -q
bin=$PWD/target/release/smbdirectd
work=$(mktemp -d /tmp/fuzz-smb2.XXXXXX)
port=$((20000 + RANDOM % 20000))
printf '%s\n' torture-password | "$bin" user add torture --users "$work/users" >/dev/null
"$bin" serve --provider soft --upper smb2 --listen "127.0.0.1:$port" --cores 1 \
	--idle-park-us 200 --store-size "$store" --admin-socket "$work/admin.sock" \
	--users "$work/users" --guest-ok >"$work/server.log" 2>&1 &
srv=$!
trap 'kill "$srv" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
	grep -q 'serving on' "$work/server.log" 2>/dev/null && break
	sleep 0.1
done
grep -q 'serving on' "$work/server.log" || { cat "$work/server.log"; echo "fuzz-smb2: the server did not come up"; exit 1; }

status=0
start=$(date +%s)
for i in $(seq "$runs"); do
	seed=$(((RANDOM << 30) ^ (RANDOM << 15) ^ RANDOM ^ (i << 45)))
	for case in smb2-mutated-requests smb2-mutated-handshake; do
		out=$(SMBDIRECTD_TORTURE_SEED=$seed SMBDIRECTD_TORTURE_MUTATIONS=$mutations \
			"$bin" torture --connect "127.0.0.1:$port" --provider soft --case "$case" \
			--admin-socket "$work/admin.sock" 2>&1) || true
		if ! grep -q '^PASS' <<<"$out"; then
			echo "fuzz-smb2: run $i, $case, SMBDIRECTD_TORTURE_SEED=$seed SMBDIRECTD_TORTURE_MUTATIONS=$mutations:"
			tail -n 3 <<<"$out"
			status=1
			break 2
		fi
	done
	kill -0 "$srv" 2>/dev/null || { echo "fuzz-smb2: the server died in run $i (seed $seed)"; status=1; break; }
	echo "fuzz-smb2: run $i/$runs passed (seed $seed, $((2 * mutations)) requests)"
done

stats=$("$bin" stats --admin-socket "$work/admin.sock" --json 2>/dev/null || true)
live=$(grep -o '"total":{"connections":[0-9]*' <<<"$stats" | grep -o '[0-9]*$' || echo "?")
sessions=$(grep -o '"sessions":[0-9]*' <<<"$stats" | head -n1 | grep -o '[0-9]*$' || echo "?")
opens=$(grep -o '"opens":[0-9]*' <<<"$stats" | head -n1 | grep -o '[0-9]*$' || echo "?")
kill -TERM "$srv" 2>/dev/null || true
rc=0
wait "$srv" || rc=$?
trap - EXIT
echo "fuzz-smb2: $(($(date +%s) - start)) s; the server then held $live connection(s), $sessions session(s), $opens open(s); it exited $rc"
if [ "$live/$sessions/$opens/$rc" != "0/0/0/0" ]; then
	status=1
fi
if grep -a -qi panic "$work/server.log"; then
	echo "fuzz-smb2: the server log has a panic"
	status=1
fi
if grep -a 'final: pool' "$work/server.log" | awk -F'[ /]' '{ if ($(NF-3) != $(NF-2)) bad = 1 } END { exit bad }'; then
	:
else
	echo "fuzz-smb2: pool buffers missing at exit:"
	grep -a 'final: pool' "$work/server.log"
	status=1
fi
if [ "$status" -eq 0 ]; then
	rm -rf "$work"
	echo "fuzz-smb2: passed"
else
	echo "fuzz-smb2: FAILED (server log: $work/server.log)"
fi
exit "$status"
