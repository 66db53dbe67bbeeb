#!/usr/bin/env bash
# The Linux kernel's SMB client (cifs.ko) mounts smbdirectd over SMB Direct,
# inside the Soft-RoCE guest of ../shared/rxe-vm, with the SMB-Direct-enabled
# cifs.ko/ksmbd.ko built by ../shared/kernel-smbd (docs/linux-client.md).
#
#   scripts/cifs-tests.sh            # mount battery (vers 3.0, 3.0.2, 3.1.1, signed once)
#   scripts/cifs-tests.sh --qos      # share default policy: fio IOPS with and without a limit
#   scripts/cifs-tests.sh --bench    # fio through cifs.ko: ksmbd.ko vs smbdirectd (raw figures;
#                                    # scripts/bench-cifs.sh makes the table rows)
#
# Host side: builds the modules through the rig if they are missing (~1.5 min,
# cached in /var/cache/kernel-smbd), builds smbdirectd (debug for the battery, release for --qos and --bench:
# they measure; CIFS_PROFILE overrides), boots the
# guest under `flock /tmp/rxe-vm.lock` and runs scripts/cifs-guest.sh in it.
# Logs, the server's pcap (tshark -r F -2 -Y smb_direct) and the guest's
# dmesg land in target/cifs-tests/ (target/cifs-tests-qos/, -bench/). Without the rigs it says "skipped" and
# exits 0.
# env: RXEVM (run-in-rxe-vm.sh), KSMBD_RIG (kernel-smbd directory),
#      CIFS_TESTS_TIMEOUT (guest time limit, s), CIFS_VERS, CIFS_FYI,
#      CIFS_PROFILE (debug or release: which smbdirectd to serve; the default is
#      debug for the battery, release for --qos and --bench);
#      --qos: QOS_IOPS (1000), QOS_JOBS (1), QOS_QD (16), QOS_RUNTIME (6 s);
#      --bench: BENCH_PAIRS (5), BENCH_RUNTIME (5 s), BENCH_ONLY (job names),
#      BENCH_ALT (serve flags of a third server in every round),
#      BENCH_ALT_BIN (that third server's binary: another build); see
#      scripts/bench-cifs.sh, which sets the first three
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=${1:---test}
case $MODE in --test | --qos | --bench) ;; *) echo "usage: $0 [--test|--qos|--bench]" >&2; exit 2 ;; esac

RXEVM=${RXEVM:-$ROOT/../shared/rxe-vm/run-in-rxe-vm.sh}
[ -x "$RXEVM" ] || RXEVM=/work/shared/rxe-vm/run-in-rxe-vm.sh
RIG=${KSMBD_RIG:-$ROOT/../shared/kernel-smbd}
[ -x "$RIG/build-kernel-smbd.sh" ] || RIG=/work/shared/kernel-smbd
if [ ! -x "$RXEVM" ] || [ ! -x "$RIG/build-kernel-smbd.sh" ]; then
	echo "cifs-tests: rxe-vm ($RXEVM) or kernel-smbd ($RIG) not found"
	echo "cifs-tests: skipped: the Soft-RoCE guest and kernel SMB rig are not available"
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "cifs-tests: skipped: needs root (the rig installs packages and boots the guest)"
	exit 0
fi
# one directory per mode: a queued run must not write into a running one's
OUT=$ROOT/target/cifs-tests
[ "$MODE" = --test ] || OUT=$OUT-${MODE#--}
mkdir -p "$OUT"
CACHE=${KSMBD_CACHE:-/var/cache/kernel-smbd}
export KSMBD_CACHE=$CACHE

start=$(date +%s)
# The guest runs on the host's file system: what cifs-guest.sh uses beyond
# the rigs' packages (the rig installs cifs-utils, fio and ksmbd-tools).
missing=()
for p in jq iproute2 util-linux; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "cifs-tests: installing ${missing[*]}"
	timeout 600 apt-get -o DPkg::Lock::Timeout=300 update -qq >"$OUT/apt.log" 2>&1 &&
		DEBIAN_FRONTEND=noninteractive timeout 900 apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
			--no-install-recommends "${missing[@]}" >>"$OUT/apt.log" 2>&1 || {
		tail -n 20 "$OUT/apt.log"
		echo "cifs-tests: FAILED: installing ${missing[*]}"
		exit 1
	}
fi
echo "cifs-tests: modules ($RIG/build-kernel-smbd.sh)"
nice -n 5 "$RIG/build-kernel-smbd.sh" >"$OUT/build-kernel.log" 2>&1 || {
	tail -n 20 "$OUT/build-kernel.log"
	echo "cifs-tests: FAILED: building cifs.ko/ksmbd.ko"
	exit 1
}
# The battery serves the debug binary: `cargo test --workspace` (CI's first
# step) has built it already, a release build would compile everything
# again. --qos and --bench measure rates, so they serve the optimized one
# (the debug binary under TCG serves a fraction of its IOPS, and a 1,000
# IOPS limit it never reaches would show nothing).
if [ "$MODE" = --test ]; then default_profile=debug; else default_profile=release; fi
PROFILE=${CIFS_PROFILE:-$default_profile}
echo "cifs-tests: building smbdirectd ($PROFILE)"
if [ "$PROFILE" = release ]; then
	nice -n 5 cargo build --release --locked --bin smbdirectd 2>&1 | tail -n 3
else
	nice -n 5 cargo build --locked --bin smbdirectd 2>&1 | tail -n 3
fi
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/$PROFILE/smbdirectd
[ -x "$BIN" ] || { echo "cifs-tests: FAILED: $BIN not built"; exit 1; }
built=$(date +%s)
echo "cifs-tests: built in $((built - start)) s; booting the rxe VM (mode $MODE)"

TMO=${CIFS_TESTS_TIMEOUT:-1200}
status=0
# bash reads a script as it runs it: the guest runs a copy (host /tmp is
# visible in the guest), so editing the script meanwhile cannot break a run
GUEST=$(mktemp /tmp/cifs-guest.XXXXXX)
trap 'rm -f "$GUEST"' EXIT
cp "$ROOT/scripts/cifs-guest.sh" "$GUEST"
chmod +x "$GUEST"
# the VM's time counts from when the lock is ours (another run may hold it)
rm -f "$OUT/vm-start" "$OUT"/guest-oops.*
# An oops of the guest's cifs.ko (Linux 6.1's SMB Direct client races its
# own teardown work against smbd_destroy(): an RIP or workqueue in [cifs],
# fixed upstream in 2025, see docs/linux-client.md "Client oopses") leaves
# the guest's client unusable, so every later mount of that boot fails.
# Such a run is booted once more and said so; a second one fails the run.
# Only a kernel oops naming [cifs] counts: smbdirectd runs in user space,
# and any other failure (a failed check, a hang) fails at once.
client_oops() {
	grep -qE 'BUG: |Oops: ' "$1" 2>/dev/null || return 1
	grep -m1 -oE '(RIP: [0-9a-f]+:|Workqueue: )[^ ]+ [^ ]+ \[cifs\]' "$1"
}
for attempt in 1 2; do
	status=0
	flock /tmp/rxe-vm.lock sh -c 'date +%s >"$1"; shift; exec "$@"' _ "$OUT/vm-start" \
		timeout $((TMO + 120)) "$RXEVM" --timeout "$TMO" -- \
		"$GUEST" "$BIN" "$MODE" >"$OUT/guest.out" 2>"$OUT/guest.err" || status=$?
	[ "$status" = 0 ] && break
	oops=$(client_oops "$OUT/guest.err") || break
	[ "$attempt" = 2 ] && { echo "cifs-tests: the guest's cifs.ko oopsed again ($oops)"; break; }
	mv "$OUT/guest.out" "$OUT/guest-oops.out"
	mv "$OUT/guest.err" "$OUT/guest-oops.err"
	grep -E '^(FAIL|===)' "$OUT/guest-oops.out" | head -n 20
	echo "cifs-tests: the guest's cifs.ko oopsed ($oops): a Linux 6.1 client teardown race" \
		"(docs/linux-client.md, \"Client oopses\"), not a server failure; that boot's log is" \
		"$OUT/guest-oops.{out,err}; booting once more"
done
end=$(date +%s)
vm0=$(cat "$OUT/vm-start" 2>/dev/null || echo "$built")
[ "$vm0" -gt "$built" ] && echo "cifs-tests: waited $((vm0 - built)) s for /tmp/rxe-vm.lock"
# the guest's logs come back archived on its stdout
sed -n '/^=== ARCHIVE BEGIN/,/^=== ARCHIVE END/p' "$OUT/guest.out" | sed '1d;$d' | base64 -d 2>/dev/null |
	tar -C "$OUT" -xzf - 2>/dev/null || echo "cifs-tests: no log archive from the guest"
sed '/^=== ARCHIVE BEGIN/,/^=== ARCHIVE END/d' "$OUT/guest.out" >"$OUT/guest.log"
cat "$OUT/guest.log"
[ -s "$OUT/guest.err" ] && { echo "--- guest stderr (tail)"; tail -n 20 "$OUT/guest.err"; }
case $status in
0) echo "cifs-tests: passed (build $((built - start)) s, VM $((end - vm0)) s; logs in $OUT)" ;;
124) echo "cifs-tests: FAILED: the guest timed out after $TMO s (logs in $OUT)" ;;
125) echo "cifs-tests: FAILED: the VM could not start" ;;
*) echo "cifs-tests: FAILED (exit $status; build $((built - start)) s, VM $((end - vm0)) s; logs in $OUT)" ;;
esac
exit $status
