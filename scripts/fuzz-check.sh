#!/usr/bin/env bash
# Keeps the fuzz targets (fuzz/, its own workspace and lock file) building
# and their rules holding, on a stable toolchain without cargo-fuzz:
#
#   scripts/fuzz-check.sh [--runs N]
#
# Builds every target of fuzz/Cargo.toml with `cargo build --locked` on
# the stable compiler, instrumented for coverage as cargo-fuzz does but
# without a sanitizer (cargo-fuzz's -Zsanitizer needs nightly), and runs
# each one over its hand-built seeds in fuzz/seeds/<target>, then for N
# (default 200000) coverage-guided executions from them with a fixed
# random seed, so that a failure reproduces. A target's own rules
# (docs/fuzzing.md) fail the run as a panic does. A regression check that
# keeps the targets, their lock file and their seeds alive in CI, not a
# campaign: campaigns run for hours with cargo-fuzz (docs/fuzzing.md).
# Shown able to fail: a server that cleared its flow table before refusing
# a GET_STATUS with too small a MaxOutputResponse failed `sqos_server` at
# 20,000 executions.
#
# About 40 s to build on two cores (libFuzzer's C++ and the protocol crate)
# and 25 s for the eight targets.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=200000
while [ $# -gt 0 ]; do
	case $1 in
	--runs) runs=$2; shift 2 ;;
	-h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
	*) echo "fuzz-check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
case $runs in '' | *[!0-9]*) echo "fuzz-check.sh: --runs needs a count" >&2; exit 2 ;; esac

target_dir=${FUZZ_CHECK_TARGET_DIR:-$PWD/fuzz/target/check}
triple=$(rustc -vV | sed -n 's/^host: //p')
# What cargo-fuzz passes to rustc, less its sanitizer (-Zsanitizer needs a
# nightly compiler): libFuzzer's coverage instrumentation (stable codegen
# flags) and the fuzzing cfg. With --target, build scripts are built
# without them.
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions"
echo "fuzz-check.sh: building the fuzz targets (fuzz/, --locked, coverage-instrumented, no sanitizer)"
cargo build --release --locked --manifest-path fuzz/Cargo.toml --target "$triple" --target-dir "$target_dir"

targets=$(sed -n 's/^name = "\([a-z0-9_]*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^smbdirect')
[ -n "$targets" ] || { echo "fuzz-check.sh: no [[bin]] targets found in fuzz/Cargo.toml" >&2; exit 1; }
work=$(mktemp -d /tmp/fuzz-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
log=$work/log
failed=0
for t in $targets; do
	bin=$target_dir/$triple/release/$t
	seeds=fuzz/seeds/$t
	if [ ! -d "$seeds" ] || [ -z "$(ls -A "$seeds")" ]; then
		echo "fuzz-check.sh: $t has no seeds in $seeds" >&2
		failed=1
		continue
	fi
	nseeds=$(ls "$seeds" | wc -l)
	# -runs=0: every seed once. Then the mutations, from a copy of the
	# seeds (libFuzzer adds what it keeps to its first corpus directory;
	# fuzz/seeds stays as committed).
	if ! "$bin" -runs=0 "$seeds" >"$log" 2>&1; then
		echo "fuzz-check.sh: $t FAILED on its seeds:" >&2
		tail -30 "$log" >&2
		failed=1
		continue
	fi
	rm -rf "$work/corpus"
	cp -r "$seeds" "$work/corpus"
	if [ "$runs" -gt 0 ] && ! "$bin" -runs="$runs" -seed=1 -max_len=4096 \
		-artifact_prefix="$work/" "$work/corpus" >"$log" 2>&1; then
		echo "fuzz-check.sh: $t FAILED after mutations (reproduce: cp -r $seeds /tmp/c && $bin -runs=$runs -seed=1 -max_len=4096 /tmp/c):" >&2
		tail -30 "$log" >&2
		failed=1
		continue
	fi
	echo "fuzz-check.sh: $t: $nseeds seeds and $runs mutations passed"
done
exit $failed
