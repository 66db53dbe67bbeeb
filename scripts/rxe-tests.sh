#!/usr/bin/env bash
# Runs the verbs provider's runtime tests on a real RDMA device: builds the
# test binaries on the host, boots the Soft-RoCE (rdma_rxe) QEMU guest of
# shared/rxe-vm and runs them inside it, against rxe0 at $RXE_IP.
#
#   scripts/rxe-tests.sh            # build, boot, run; summary line; exit 1 on failure
#   RXEVM=/path/run-in-rxe-vm.sh scripts/rxe-tests.sh
#   RXE_TESTS_TIMEOUT=300 scripts/rxe-tests.sh   # guest time limit (s)
#
# Runs: tests/verbs_runtime.rs (the provider's own cases) and
# tests/verbs_conformance.rs (the provider conformance suite), plus the
# verbs unit tests, `serve` over verbs (tests/serve_e2e.rs) and the
# remote-access safety cases on verbs (tests/remote_access.rs, module
# verbs: every edge of a grant, overlapping grants, a third peer's and
# stale tokens; memory windows bound to the queue pair). Without the VM script it says "skipped: rxe-vm not
# available" and exits 0. On a host whose kernel has rdma_rxe, the same
# binaries run without the VM after scripts/setup-soft-roce.sh (set RXE_IP).
#
# Timing (2-core host, TCG guest): 30-55 s with the test binaries already
# built (guest boot ~10 s, 65 tests ~20-45 s under emulation, the 4
# remote-access cases ~2.5 s of it; measured with other jobs loading the
# host: VM 55 s, incremental build 63 s); building them from scratch adds
# about 65 s. The first run on a machine also installs qemu
# and caches ~440 MB of guest kernel and modules: that first boot took 36 s
# in all here (instead of ~10 s).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ "${1:-}" = "--in-guest" ]; then
	# Inside the VM: run each binary, print a summary line, exit non-zero on
	# any failure.
	shift
	pass=0 fail=0 skipped=0
	failed=()
	for spec in "$@"; do
		bin=${spec%%::*}
		filter=""
		[ "$spec" != "$bin" ] && filter=${spec#*::}
		name=$(basename "$bin")
		echo "=== $name ${filter:+(filter $filter)}"
		out=$(mktemp)
		# shellcheck disable=SC2086
		if "$bin" --test-threads=1 $filter 2>&1 | tee "$out"; then :; else failed+=("$name"); fi
		p=$(sed -n 's/^test result: .*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1/p' "$out" | tail -1)
		f=$(sed -n 's/^test result: .*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\2/p' "$out" | tail -1)
		s=$(grep -c "skipped:" "$out" || true)
		pass=$((pass + ${p:-0})) fail=$((fail + ${f:-1})) skipped=$((skipped + s))
		rm -f "$out"
	done
	echo "rxe-tests: device ${RXE_DEV:-?} at ${RXE_IP:-?}; $skipped test(s) reported skipped"
	echo "rxe-tests: $pass passed, $fail failed"
	[ ${#failed[@]} -eq 0 ] || { echo "rxe-tests: failing binaries: ${failed[*]}"; exit 1; }
	[ "$skipped" -eq 0 ] || { echo "rxe-tests: tests skipped inside the guest: the device was not usable"; exit 1; }
	exit 0
fi

RXEVM=${RXEVM:-$ROOT/../shared/rxe-vm/run-in-rxe-vm.sh}
if [ ! -x "$RXEVM" ]; then
	echo "rxe-tests: $RXEVM not found (set RXEVM to run-in-rxe-vm.sh)"
	echo "rxe-tests: skipped: rxe-vm not available"
	exit 0
fi

start=$(date +%s)
echo "rxe-tests: building test binaries"
json=$(cargo test -p smbdirect-dataplane --no-run --message-format=json \
	--test verbs_runtime --test verbs_conformance --lib 2>/dev/null) || {
	cargo test -p smbdirect-dataplane --no-run --test verbs_runtime --test verbs_conformance --lib
	exit 1
}
# The "executable" of each compiler-artifact that is a test target.
exe() { # target name -> path
	printf '%s\n' "$json" | grep '"reason":"compiler-artifact"' | grep "\"name\":\"$1\"" |
		grep -o '"executable":"[^"]*"' | head -1 | sed 's/"executable":"\(.*\)"/\1/'
}
e2e_json=$(cargo test -p smbdirectd --no-run --message-format=json --test serve_e2e \
	--test remote_access 2>/dev/null) || {
	cargo test -p smbdirectd --no-run --test serve_e2e --test remote_access
	exit 1
}
json="$json
$e2e_json"
runtime=$(exe verbs_runtime)
conformance=$(exe verbs_conformance)
unit=$(exe smbdirect_dataplane)
e2e=$(exe serve_e2e)
remote=$(exe remote_access)
for b in "$runtime" "$conformance" "$unit" "$e2e" "$remote"; do
	[ -x "$b" ] || { echo "rxe-tests: test binary not found in cargo's output"; exit 1; }
done
built=$(date +%s)
echo "rxe-tests: built in $((built - start)) s; booting the rxe VM"

status=0
"$RXEVM" --timeout "${RXE_TESTS_TIMEOUT:-300}" -- "$ROOT/scripts/rxe-tests.sh" --in-guest \
	"$runtime" "$conformance" "$unit::provider::verbs" "$e2e::serve_over_verbs" \
	"$remote::verbs::" || status=$?
end=$(date +%s)
case $status in
0) echo "rxe-tests: passed (build $((built - start)) s, VM $((end - built)) s)" ;;
124) echo "rxe-tests: FAILED: the guest timed out after ${RXE_TESTS_TIMEOUT:-300} s" ;;
125) echo "rxe-tests: FAILED: the VM could not start (see the console log above)" ;;
*) echo "rxe-tests: FAILED (exit $status; build $((built - start)) s, VM $((end - built)) s)" ;;
esac
exit $status
