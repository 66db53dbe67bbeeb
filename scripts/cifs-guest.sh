#!/usr/bin/env bash
# Runs inside the Soft-RoCE guest (started by scripts/cifs-tests.sh): loads
# the SMB-Direct-enabled cifs.ko (and ksmbd.ko for --bench) built by
# ../shared/kernel-smbd, starts `smbdirectd serve --provider verbs` on
# $RXE_IP:445 with a directory store and a users file, mounts the share with
# the Linux client over RDMA (-o rdma) and checks it behaves as a file system.
#
#   cifs-guest.sh BIN          mount battery (vers 3.0, 3.0.2, 3.1.1 + signing),
#                              transport proof, stats back to baseline,
#                              wrong password refused
#   cifs-guest.sh BIN --qos    share default policy of QOS_IOPS: fio randread
#                              with and without it (and at 40 % of the
#                              unlimited rate when that is not above QOS_IOPS)
#   cifs-guest.sh BIN --bench  fio through the same cifs.ko, ksmbd.ko vs
#                              smbdirectd, alternated for BENCH_PAIRS pairs;
#                              prints "bench: pair=P server=S job=J value=V"
#
# Every step that can block runs under `timeout` (a failed cifs mount can
# leave cifsd threads hung in smbd_destroy() on 6.1). Logs, the server's
# pcap and dmesg are archived to stdout between ARCHIVE markers (the guest's
# writes are discarded when it stops); the host unpacks them.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export LC_ALL=C
BIN=$1
MODE=${2:---test}
CACHE=${KSMBD_CACHE:-/var/cache/kernel-smbd}
KVER=$(uname -r)
RXEVM_CACHE=${RXEVM_CACHE:-/var/cache/rxe-vm}
MODTREE=$RXEVM_CACHE/linux-image-$KVER/lib/modules
BB=$RXEVM_CACHE/busybox/bin/busybox
IP=${RXE_IP:-10.0.2.15}
USER_=smbtest PASS_=Cifs-Test-pw1
STORE=/srv/cifsstore MNT=/mnt/cifs LOG=/tmp/cifs-guest.$$
VERSIONS=${CIFS_VERS:-3.0 3.0.2 3.1.1}
QOS_IOPS=${QOS_IOPS:-1000}
QOS_JOBS=${QOS_JOBS:-1} QOS_QD=${QOS_QD:-16} QOS_RUNTIME=${QOS_RUNTIME:-6}
BENCH_PAIRS=${BENCH_PAIRS:-5} BENCH_RUNTIME=${BENCH_RUNTIME:-5}
# smbdirectd listens here; 445 in --bench mode is ksmbd's (cifs tries 5445 first)
SRV_PORT=445
QOS_POLICY=8d7f0c7e-2f9b-4c58-9a35-1d3c5e6f7a81
FAILS=0 SRV_PID=
mkdir -p "$LOG"
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd # process substitution

up() { local u; read -r u _ </proc/uptime; echo "$u"; }
say() { echo "=== [$(up)] $*"; echo "=== [$(up)] $*" >&2; kmsg "$*"; }
step() { echo "--- [$(up)] $*" >&2; kmsg "$*"; }
ok() { echo "OK: $*"; }
bad() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
kmsg() { echo "cifs-guest: $*" >/dev/kmsg; }
drop_caches() { timeout 120 sh -c 'echo 3 >/proc/sys/vm/drop_caches'; }
archive() {
	dmesg >"$LOG/dmesg.txt" 2>&1
	echo "=== ARCHIVE BEGIN"
	# the battery's random input files (64 MiB and more) stay behind
	tar -C "$LOG" --exclude=r64m --exclude=r64m.back --exclude=wa --exclude=wb -czf - . | base64 -w 120
	echo "=== ARCHIVE END"
}
finish() {
	stop_server
	say "result: $FAILS failed check(s)"
	archive
	[ "$FAILS" = 0 ] && exit 0
	exit 1
}
die() {
	echo "FATAL: $*"
	FAILS=$((FAILS + 1))
	dmesg | grep -iE 'cifs|smb|rdma' | tail -n 30
	finish
}

# ------------------------------------------------------------- modules
load_modules() {
	say "loading the rig's modules ($CACHE)"
	timeout 30 mount --bind "$MODTREE" /lib/modules || die "bind $MODTREE"
	for m in ib_core rdma_cm cifs_arc4 cifs_md4 netfs fscache dns_resolver; do
		timeout 60 "$BB" modprobe "$m" || die "modprobe $m"
	done
	if [ "$MODE" = --bench ]; then
		timeout 60 "$BB" insmod "$CACHE/ksmbd.ko" || die "insmod ksmbd.ko"
	fi
	timeout 60 "$BB" insmod "$CACHE/cifs.ko" || die "insmod cifs.ko"
	# cifs FYI debug: every SMB2 command and status goes to dmesg (a printk
	# per request: off by default where fio measures)
	local fyi=1
	[ "$MODE" = --test ] || fyi=0
	[ "${CIFS_FYI:-$fyi}" = 1 ] && echo 1 >/proc/fs/cifs/cifsFYI
}

# ------------------------------------------------------------- smbdirectd
prepare_store() {
	mkdir -p "$STORE"
	mountpoint -q "$STORE" || timeout 30 mount -t tmpfs -o size=600m,mode=0777 cifsstore "$STORE" || die tmpfs
}
start_server() { # extra serve flags...
	prepare_store
	[ "$(cat /proc/sys/vm/nr_hugepages)" -ge 64 ] || echo 64 >/proc/sys/vm/nr_hugepages
	[ -s "$LOG/users" ] || printf '%s\n' "$PASS_" | timeout 30 "$BIN" user add "$USER_" --users "$LOG/users" >/dev/null ||
		die "smbdirectd user add"
	local n=${SRV_RUN:-0}
	SRV_RUN=$((n + 1))
	# a capture costs a copy per message: only where nothing is measured
	local capture=()
	[ "$MODE" = --test ] && capture=(--capture "$LOG/server$n.pcap")
	# rxe0 allows CQs of up to 32767 entries: a few connections only
	# the battery busy-polls 200 us before sleeping, to leave the guest's
	# two vCPUs to cifs.ko and rxe; the bench runs serve's default (10 ms),
	# what a storage node deploys (docs/bench-results.md, session 28:
	# 200 us cost the 1 MiB rows and QD 1 reads the worker's wake-ups);
	# a caller's own --idle-park-us wins
	local park=(--idle-park-us 200)
	[ "$MODE" = --bench ] && park=()
	[[ " $* " == *" --idle-park-us "* ]] && park=()
	# the worker polls on vCPU 1; vCPU 0 (fio, cifs.ko) makes the store's
	# large copies while the worker has another transfer in flight, as
	# ksmbd.ko's kworkers copy on whichever vCPU is free
	local copy=(--store-copy-cores 0)
	[[ " $* " == *" --store-copy-cores "* ]] && copy=()
	"$BIN" serve --provider verbs --listen "$IP:$SRV_PORT" --cores 1 --max-connections 8 --pool-mem 128M \
		"${park[@]}" "${copy[@]}" --store "$STORE" --users "$LOG/users" "${capture[@]}" --stats-interval 0 "$@" \
		> >(tee "$LOG/server$n.log" | sed 's/^/server: /' >&2) 2>&1 &
	SRV_PID=$!
	for ((i = 0; i < 300; i++)); do
		grep -q "serving on" "$LOG/server$n.log" 2>/dev/null && break
		kill -0 "$SRV_PID" 2>/dev/null || { cat "$LOG/server$n.log"; die "smbdirectd serve exited"; }
		sleep 0.2
	done
	grep -q 'serving on' "$LOG/server$n.log" || die "smbdirectd serve did not come up"
	echo "smbdirectd serve pid $SRV_PID: $(grep 'serving on' "$LOG/server$n.log" | head -n1)"
}
stop_server() {
	[ -n "$SRV_PID" ] || return 0
	kill -INT "$SRV_PID" 2>/dev/null
	for ((i = 0; i < 100; i++)); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.2; done
	kill -0 "$SRV_PID" 2>/dev/null && { echo "smbdirectd did not stop on SIGINT; killing"; kill -9 "$SRV_PID"; }
	wait "$SRV_PID" 2>/dev/null
	SRV_PID=
}
stats() { timeout 20 "$BIN" stats --json --port "$SRV_PORT"; }
# sessions opens grants_live and, per pool class, free buffers
stat_summary() {
	stats | jq -c '{sessions, opens, provider_counters,
		free: [.pool.classes[] | "\(.name)=\(.free)/\(.total)"]}' 2>&1
}

# ------------------------------------------------------------- client
do_mount() { # vers extra-options
	kmsg "mount vers=$1 $2"
	local t0=$(up)
	if timeout 120 mount -t cifs "//$IP/data" "$MNT" \
		-o "rdma,vers=$1,username=$USER_,password=$PASS_,uid=0,gid=0,noperm,cache=strict${2:+,$2}" \
		>"$LOG/mount.out" 2>&1; then
		echo "mounted vers=$1 ${2:-} in $(awk "BEGIN{print $(up) - $t0}") s"
		return 0
	fi
	cat "$LOG/mount.out"
	echo "--- dmesg (cifs)"
	dmesg | grep -iE 'cifs|smb|status' | tail -n 40
	return 1
}
do_umount() {
	kmsg "umount"
	timeout 120 umount "$MNT" && return 0
	echo "umount failed; lazy"
	timeout 30 umount -l "$MNT"
	return 1
}

proof() { # the transport is SMB Direct, not TCP
	if grep -q 'SMBDirect (in hex) protocol version' /proc/fs/cifs/DebugData; then
		ok "cifs DebugData shows an SMBDirect transport"
		grep -E -A4 'SMBDirect \(in hex\)' /proc/fs/cifs/DebugData | head -n 5 | sed 's/^/    /'
	else
		bad "cifs DebugData shows no SMBDirect transport"
		head -n 40 /proc/fs/cifs/DebugData
	fi
	local tcp
	tcp=$(timeout 10 ss -tnH state established '( sport = :445 or dport = :445 )' 2>/dev/null)
	[ -z "$tcp" ] && ok "no TCP connection on port 445" || bad "TCP connection on port 445: $tcp"
}

# A removal reaches the store shortly after the client's call returns: the
# server answers CLOSE of a delete-on-close file first and unlinks in the
# background (dataplane/src/smb2/dirstore.rs); allow it 5 s.
gone() { # path
	local i
	for ((i = 0; i < 100; i++)); do
		[ -e "$1" ] || return 0
		sleep 0.05
	done
	return 1
}
empty() { # dir
	local i
	for ((i = 0; i < 100; i++)); do
		[ -z "$(ls -A "$1")" ] && return 0
		sleep 0.05
	done
	return 1
}

cmp_ok() { # a b what
	if cmp -s "$1" "$2"; then ok "$3"; else bad "$3 (data differ)"; fi
}

battery() { # full|small
	local m=$MNT what=$1 f
	say "battery ($what) on $m"
	# small files, inline
	step "small files, inline"
	timeout 30 sh -c 'echo hello-over-smb-direct >"$1"' _ "$m/hello.txt" || bad "small write"
	head -c 4096 /dev/urandom >"$LOG/r4k"
	head -c 100000 /dev/urandom >"$LOG/r100k"
	timeout 30 cp "$LOG/r4k" "$m/r4k" && timeout 30 cp "$LOG/r100k" "$m/r100k" || bad "cp small files"
	drop_caches
	[ "$(timeout 30 cat "$m/hello.txt")" = hello-over-smb-direct ] && ok "small file read back" || bad "small file read back"
	cmp_ok "$LOG/r4k" "$m/r4k" "4 KiB file read back"
	cmp_ok "$LOG/r100k" "$m/r100k" "100 KB file read back"
	cmp_ok "$LOG/r100k" "$STORE/r100k" "100 KB file as stored on the server"
	if [ "$what" = full ]; then
		# 64 MiB O_DIRECT: above the client's RDMA threshold, through RDMA read/write
		step "64 MiB O_DIRECT: above the client's RDMA threshold, through RDMA read/write"
		[ -s "$LOG/r64m" ] || head -c $((64 << 20)) /dev/urandom >"$LOG/r64m"
		local t0=$(up)
		timeout 300 dd if="$LOG/r64m" of="$m/big" bs=1M oflag=direct status=none || bad "64 MiB O_DIRECT write"
		local t1=$(up)
		drop_caches
		timeout 300 dd if="$m/big" of="$LOG/r64m.back" bs=1M iflag=direct status=none || bad "64 MiB O_DIRECT read"
		local t2=$(up)
		echo "64 MiB O_DIRECT: write $(awk "BEGIN{print $t1 - $t0}") s, read $(awk "BEGIN{print $t2 - $t1}") s"
		cmp_ok "$LOG/r64m" "$LOG/r64m.back" "64 MiB O_DIRECT file read back"
		cmp_ok "$LOG/r64m" "$STORE/big" "64 MiB file as stored on the server"
		rm -f "$LOG/r64m.back"
		timeout 60 rm -f "$m/big" || bad "rm big"
	fi
	# directories
	step "directories"
	timeout 30 mkdir -p "$m/d1/d2/d3" && [ -d "$STORE/d1/d2/d3" ] && ok "mkdir -p" || bad "mkdir -p"
	timeout 30 rmdir "$m/d1/d2/d3" && gone "$STORE/d1/d2/d3" && ok "rmdir" || bad "rmdir"
	timeout 30 rmdir "$m/d1" 2>/dev/null && bad "rmdir of a non-empty directory succeeded" || ok "rmdir of a non-empty directory refused"
	# rename (file, directory, over an existing file)
	step "rename (file, directory, over an existing file)"
	timeout 30 mv "$m/hello.txt" "$m/d1/renamed.txt" && [ -e "$STORE/d1/renamed.txt" ] && [ ! -e "$STORE/hello.txt" ] &&
		ok "rename file into a subdirectory" || bad "rename file"
	timeout 30 mv "$m/d1/d2" "$m/d2moved" && [ -d "$STORE/d2moved" ] && ok "rename directory" || bad "rename directory"
	timeout 30 mv -f "$m/r4k" "$m/r100k" && cmp_ok "$LOG/r4k" "$m/r100k" "rename over an existing file"
	# unlink
	step "unlink"
	timeout 30 rm "$m/r100k" && [ ! -e "$m/r100k" ] && gone "$STORE/r100k" && ok "unlink" || bad "unlink"
	# truncate
	step "truncate"
	timeout 30 sh -c 'head -c 5000 /dev/zero >"$1"' _ "$m/t" || bad "write t"
	timeout 30 truncate -s 123457 "$m/t" && [ "$(stat -c %s "$m/t")" = 123457 ] && [ "$(stat -c %s "$STORE/t")" = 123457 ] &&
		ok "truncate up (123457)" || bad "truncate up: $(stat -c %s "$m/t")"
	timeout 30 truncate -s 10 "$m/t" && drop_caches && [ "$(stat -c %s "$m/t")" = 10 ] && ok "truncate down (10)" || bad "truncate down"
	# times and sizes
	step "times and sizes"
	timeout 30 touch -d '2021-03-04 05:06:07 UTC' "$m/t" || bad "touch -d"
	drop_caches
	[ "$(stat -c %Y "$m/t")" = "$(date -d '2021-03-04 05:06:07 UTC' +%s)" ] && ok "mtime set and read back" ||
		bad "mtime: $(stat -c %Y "$m/t")"
	[ "$(stat -c %Y "$STORE/t")" = "$(date -d '2021-03-04 05:06:07 UTC' +%s)" ] && ok "mtime on the server" ||
		bad "server mtime: $(stat -c %Y "$STORE/t")"
	timeout 30 ls -l --full-time "$m" >"$LOG/ls.txt" 2>&1 && grep -q ' 10 2021-03-04 05:06:07' "$LOG/ls.txt" &&
		ok "ls -l shows size and time" || { bad "ls -l"; cat "$LOG/ls.txt"; }
	timeout 30 stat "$m/t" >/dev/null && timeout 30 stat "$m/d1" | grep -q directory && ok "stat file and directory" || bad "stat"
	timeout 30 stat "$m/nonexistent" 2>/dev/null && bad "stat of a missing file succeeded" || ok "stat of a missing file: ENOENT"
	# flock: exclusive lock held by one process refuses another
	if [ "$what" = full ]; then
		heavy
	fi
	step "clean up"
	timeout 60 rm -rf "$m"/* || bad "final rm"
	empty "$STORE" && ok "share empty again" || bad "left on the server: $(ls -A "$STORE")"
}

heavy() { # flock, many files, concurrent writers (first mount only)
	local m=$MNT
	step "flock: exclusive lock held by one process refuses another"
	timeout 30 flock -x "$m/t" -c true && ok "flock" || bad "flock"
	(timeout 30 flock -x "$m/t" -c 'sleep 4') &
	local fp=$!
	sleep 1.5
	timeout 10 flock -n -x "$m/t" -c true 2>/dev/null && bad "flock -n succeeded while another holds the lock" ||
		ok "flock conflict detected"
	wait $fp
	timeout 30 flock -n -x "$m/t" -c true && ok "flock after release" || bad "flock after release"
	# many files in one directory (QUERY_DIRECTORY paging)
	step "many files in one directory (QUERY_DIRECTORY paging)"
	# 100-character names: 250 entries need more than one 64 KiB response
	local many=${MANY:-250} long
	long=$(printf 'n%.0s' {1..90})
	timeout 400 sh -c 'mkdir "$1/many" && i=0; while [ $i -lt $2 ]; do : >"$1/many/$3-$i"; i=$((i+1)); done' _ "$m" "$many" "$long" ||
		bad "create $many files"
	drop_caches
	local n
	n=$(timeout 60 ls "$m/many" | wc -l)
	[ "$n" = "$many" ] && ok "$many files listed in one directory" || bad "listed $n of $many files"
	timeout 300 rm -r "$m/many" && gone "$STORE/many" && ok "rm -r of $many files" || bad "rm -r many"
	# two concurrent writers on different files
	step "two concurrent writers on different files"
	head -c $((3 << 20)) /dev/urandom >"$LOG/wa"
	head -c $((3 << 20)) /dev/urandom >"$LOG/wb"
	timeout 120 dd if="$LOG/wa" of="$m/wa" bs=256k oflag=direct status=none &
	local pa=$!
	timeout 120 dd if="$LOG/wb" of="$m/wb" bs=64k status=none conv=fsync &
	local pb=$!
	wait $pa && wait $pb || bad "concurrent writers"
	drop_caches
	cmp_ok "$LOG/wa" "$m/wa" "concurrent writer A"
	cmp_ok "$LOG/wb" "$m/wb" "concurrent writer B"
}

test_mode() {
	start_server
	mkdir -p "$MNT"
	say "baseline"
	BASE=$(stat_summary)
	echo "$BASE"
	local first=1
	for v in $VERSIONS; do
		say "mount vers=$v over RDMA"
		if ! do_mount "$v" ""; then
			bad "mount vers=$v"
			continue
		fi
		proof
		# cifs SMB Direct tracing (debugging): e.g. 0x26 = incoming, reads, RDMA receives
		[ -n "${SMBD_LOG:-}" ] && echo "$SMBD_LOG" >/sys/module/cifs/parameters/smbd_logging_class
		if [ $first = 1 ]; then battery full; first=0; else battery small; fi
		echo "during: $(stat_summary)"
		do_umount && ok "umount vers=$v" || bad "umount vers=$v"
	done
	# wsize=4096: 6.1's cifs.ko sends other bytes than it signed for a
	# signed inline WRITE of more than one page (docs/linux-client.md);
	# the server rightly refuses those (STATUS_ACCESS_DENIED)
	say "mount vers=3.1.1 with signing (sign,wsize=4096)"
	if do_mount 3.1.1 sign,wsize=4096; then
		proof
		grep -iE 'signing|Security type' /proc/fs/cifs/DebugData | head -n 3
		battery small
		do_umount && ok "umount (signed)" || bad "umount (signed)"
	else
		bad "mount with signing"
	fi
	sleep 2
	say "stats back to baseline"
	local after
	for ((i = 0; i < 20; i++)); do
		after=$(stat_summary)
		[ "$after" = "$BASE" ] && break
		sleep 1
	done
	echo "baseline: $BASE"
	echo "after:    $after"
	[ "$after" = "$BASE" ] && ok "sessions, opens and pool buffers back to baseline (the verbs provider keeps no grant counters)" || bad "stats not back to baseline"
	say "wrong password"
	kmsg "wrong password"
	if timeout 60 mount -t cifs "//$IP/data" "$MNT" -o "rdma,vers=3.1.1,username=$USER_,password=wrong" 2>&1; then
		bad "mount with a wrong password succeeded"
		do_umount
	else
		sleep 1
		dmesg | grep -q 'STATUS_LOGON_FAILURE' && ok "wrong password refused with STATUS_LOGON_FAILURE" ||
			{ bad "no STATUS_LOGON_FAILURE in dmesg"; dmesg | tail -n 15; }
	fi
	if do_mount 3.1.1 "" && timeout 30 ls -la "$MNT" >/dev/null; then
		ok "server still serving after the refused logon"
		do_umount
	else
		bad "server not serving after the refused logon"
	fi
	stats >"$LOG/stats-final.json"
}

# fio_run NAME OUT.json ARGS...: one bounded fio run (O_DIRECT, libaio,
# time-based, group reporting); prints nothing, returns fio's status.
fio_run() {
	local name=$1 out=$2 rt=$3
	shift 3
	timeout $((rt + 150)) fio --name="$name" --direct=1 --ioengine=libaio --time_based --runtime="$rt" \
		--group_reporting --output-format=json "$@" >"$out" 2>"${out%.json}.err"
}
# fio_metric OUT.json iops|read_mbs|write_mbs
fio_metric() {
	case $2 in
	iops) jq '.jobs[0].read.iops + .jobs[0].write.iops | floor' "$1" 2>/dev/null ;;
	read_mbs) jq '.jobs[0].read.bw * 1024 / 1000000 * 100 | floor / 100' "$1" 2>/dev/null ;;
	write_mbs) jq '.jobs[0].write.bw * 1024 / 1000000 * 100 | floor / 100' "$1" 2>/dev/null ;;
	esac
}

# Share default policy (--share data:policy=GUID): fio 4 KiB random reads
# (QOS_JOBS jobs, each on its own file, QD QOS_QD) through the cifs mount,
# first with no policy, then under a policy of QOS_IOPS normalized IOPS (a
# 4 KiB read counts 1). Each Open of the share is a flow: with one job the
# policy is dedicated (the job's Open gets the limit), with several it is
# aggregated (their Opens share it), so either way it bounds fio's total.
# A limit the unlimited run does not clearly exceed shows nothing: then the
# run is repeated at 40 % of the unlimited rate as well.
qos_mode() {
	mkdir -p "$MNT"
	prepare_store
	local j
	for ((j = 0; j < QOS_JOBS; j++)); do
		head -c $((16 << 20)) /dev/zero >"$STORE/q.$j"
	done
	local -A got=()
	local unlimited=0 limits=("$QOS_IOPS") run limit iops
	qos_run() { # name [serve flags...]
		local name=$1
		shift
		start_server "$@"
		if ! do_mount 3.1.1 ""; then
			bad "mount ($name)"
			stop_server
			return 1
		fi
		# each job opens its own file: one Open, one flow each
		fio_run "qos-$name" "$LOG/fio-$name.json" "$QOS_RUNTIME" --filename_format="$MNT/q.\$jobnum" \
			--rw=randread --bs=4k --iodepth="$QOS_QD" --numjobs="$QOS_JOBS" --size=16M --ramp_time=1 ||
			bad "fio ($name)"
		[ $# -gt 0 ] && timeout 20 "$BIN" qos flows --port "$SRV_PORT" 2>&1 | head -n $((QOS_JOBS + 3))
		iops=$(fio_metric "$LOG/fio-$name.json" iops)
		echo "qos: $name: ${iops:-?} IOPS (fio randread 4k, $QOS_JOBS jobs x QD $QOS_QD, ${QOS_RUNTIME} s)"
		got[$name]=${iops:-0}
		do_umount
		stop_server
	}
	say "fio randread 4k, $QOS_JOBS jobs x QD $QOS_QD, no policy"
	qos_run unlimited
	unlimited=${got[unlimited]}
	if [ "$unlimited" -le $((QOS_IOPS * 12 / 10)) ]; then
		echo "NOTE: unlimited ($unlimited IOPS) is not clearly above $QOS_IOPS: a limit of $QOS_IOPS cannot show enforcement here; also limiting to 40 % of it"
		limits+=($((unlimited * 40 / 100)))
	fi
	for limit in "${limits[@]}"; do
		[ "$limit" -gt 0 ] || continue
		local type=dedicated
		[ "$QOS_JOBS" -gt 1 ] && type=aggregated
		printf '[[policy]]\nid = "%s"\ntype = "%s"\nmax_iops = %s\n' "$QOS_POLICY" "$type" "$limit" >"$LOG/qos-$limit.toml"
		say "fio randread 4k, $QOS_JOBS jobs x QD $QOS_QD, share default policy: $type, $limit IOPS"
		qos_run "limit$limit" --share "data:policy=$QOS_POLICY" --policy-file "$LOG/qos-$limit.toml" || continue
		iops=${got[limit$limit]}
		local cap=$((limit * 103 / 100))
		if [ "$iops" -gt 0 ] && [ "$iops" -le "$cap" ]; then
			ok "share default policy of $limit IOPS: $iops IOPS <= $limit + 3 % ($cap); unlimited $unlimited IOPS"
		else
			bad "share default policy of $limit IOPS: $iops IOPS, cap $cap; unlimited $unlimited IOPS"
		fi
		# enforcement, not just a slow run: where the unlimited rate is
		# clearly above the limit, the limited run gets most of the limit
		# (half at least: the TCG guest's speed swings with the host's load
		# between the runs)
		if [ "$unlimited" -gt $((limit * 12 / 10)) ]; then
			[ "$iops" -ge $((limit / 2)) ] && ok "limited run reaches $iops of $limit IOPS ($((iops * 100 / limit)) %)" ||
				bad "limited run reaches only $iops of $limit IOPS (unlimited $unlimited)"
		fi
	done
	rm -f "$STORE"/q.*
}

# ksmbd.ko on $IP:445 (RDMA and TCP), sharing $STORE as "data" with the
# same user, set up as ../shared/kernel-smbd/ksmbd-cifs-rdma-smoke.sh does
# (server signing disabled so that cifs may use RDMA read/write).
start_ksmbd() {
	command -v ksmbd.mountd >/dev/null || die "ksmbd-tools is not installed (the kernel-smbd rig installs it)"
	mkdir -p /etc/ksmbd
	prepare_store
	# ksmbd's kernel threads resolve the share path against PID 1's root;
	# rxe-vm runs us chrooted (/newroot)
	local kpath=$STORE pfx
	if [ "$(stat -c %d:%i /)" != "$(stat -L -c %d:%i /proc/1/root/)" ]; then
		kpath=
		for pfx in /newroot /root /sysroot; do
			if [ "$(stat -L -c %d:%i "/proc/1/root$pfx/" 2>/dev/null)" = "$(stat -c %d:%i /)" ]; then
				kpath=$pfx$STORE
				break
			fi
		done
		[ -n "$kpath" ] || die "chrooted, but cannot find our root under /proc/1/root"
	fi
	getent passwd "$USER_" >/dev/null || timeout 30 useradd -M -d /nonexistent -s /usr/sbin/nologin "$USER_" || die useradd
	cat >/etc/ksmbd/ksmbd.conf <<-EOF
		[global]
			netbios name = RXEVM
			server signing = disabled
			server multi channel support = no
			smb3 encryption = no
			smb2 leases = no
			smb2 max read = 4MB
			smb2 max write = 4MB
			smbd max io size = 8MB
		[data]
			path = $kpath
			read only = no
			writeable = yes
			guest ok = no
			store dos attributes = no
			force user = root
			force group = root
			create mask = 0666
			directory mask = 0777
	EOF
	timeout 30 ksmbd.adduser -a "$USER_" -p "$PASS_" >/dev/null || die "ksmbd.adduser"
	timeout 30 ksmbd.mountd || die "ksmbd.mountd"
	# the RDMA listener appears when mountd hands the config to the kernel
	local cm
	for ((i = 0; i < 100; i++)); do
		cm=$(timeout 10 rdma res show cm_id 2>&1)
		grep -q 'LISTEN.*:445' <<<"$cm" && break
		sleep 0.2
	done
	grep -q 'LISTEN.*:445' <<<"$cm" || die "ksmbd has no RDMA listener on 445: $cm"
	echo "ksmbd: $cm"
}

# fio through the same cifs.ko mount (vers=3.1.1, unsigned, -o rdma) against
# smbdirectd and ksmbd.ko in turn, A B A B for BENCH_PAIRS pairs. ksmbd
# stays on port 445; smbdirectd is started on 5445 for its half of each
# pair (cifs connects to 5445 first and falls back to 445 when nothing
# listens there), so each mount reaches the server meant. Both serve the
# same tmpfs directory and the same files.
BENCH_JOBS=(
	"rr4k1 r.dat iops --rw=randread --bs=4k --iodepth=1"
	"rr4k16 r.dat iops --rw=randread --bs=4k --iodepth=16"
	"sr1m r.dat read_mbs --rw=read --bs=1m --iodepth=4"
	"sw1m w.dat write_mbs --rw=write --bs=1m --iodepth=4"
)
# Jobs run only when named in BENCH_ONLY: the 1 MiB rows at QD 1, to tell
# a per-request cost from one of overlap (docs/bench-results.md, session 25)
BENCH_EXTRA_JOBS=(
	"sr1m1 r.dat read_mbs --rw=read --bs=1m --iodepth=1"
	"sw1m1 w.dat write_mbs --rw=write --bs=1m --iodepth=1"
)
# BENCH_ONLY="rr4k1,sr1m" (bench-cifs.sh --jobs): those jobs only
if [ -n "${BENCH_ONLY:-}" ]; then
	only=()
	for spec in "${BENCH_JOBS[@]}" "${BENCH_EXTRA_JOBS[@]}"; do
		[[ ",$BENCH_ONLY," == *",${spec%% *},"* ]] && only+=("$spec")
	done
	[ ${#only[@]} -gt 0 ] || die "BENCH_ONLY=$BENCH_ONLY names no job of: ${BENCH_JOBS[*]%% *} ${BENCH_EXTRA_JOBS[*]%% *}"
	BENCH_JOBS=("${only[@]}")
fi
# "USER SYSTEM" clock ticks of process PID (nothing when it is gone); the
# fields after the ")" that closes its name, which may hold spaces
proc_ticks() { # PID
	sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | awk '{ print $12, $13 }'
}
# "busy idle smbdirectd" clock ticks: the guest's CPUs (all but idle and
# iowait), their idle, and the smbdirectd process (0 when not running)
cpu_ticks() {
	local busy idle u=0 s=0
	read -r busy idle < <(awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6 }' /proc/stat)
	[ -n "$SRV_PID" ] && read -r u s < <(proc_ticks "$SRV_PID")
	echo "$busy $idle $((${u:-0} + ${s:-0}))"
}
cpu_delta() { # "BEFORE" "AFTER" -> seconds
	awk -v a="$1" -v b="$2" -v hz="$(getconf CLK_TCK)" 'BEGIN { split(a, x); split(b, y)
		printf "guest_busy_s=%.1f guest_idle_s=%.1f smbdirectd_cpu_s=%.1f", (y[1] - x[1]) / hz, (y[2] - x[2]) / hz, (y[3] - x[3]) / hz }'
}
# "KEY VALUE" lines for where a fio run's time went, finer than cpu_ticks:
# each CPU's user, system, softirq and idle ticks, the ksoftirqd threads
# (softirq work deferred out of interrupt exit: rxe's packet processing
# when it overruns its budget), smbdirectd's user and system ticks and
# context switches, the kernel's memory-management event counters, and
# rxe0's hardware counters (rxe packets, retries, sequence errors), and
# smbdirectd's counts of large store copies
detail_snap() {
	awk '/^cpu[0-9]/ { print $1 ".user", $2 + $3; print $1 ".sys", $4; print $1 ".sirq", $8; print $1 ".idle", $5 + $6 }' /proc/stat
	local p c
	for p in /proc/[0-9]*; do
		read -r c <"$p/comm" 2>/dev/null || continue
		case $c in ksoftirqd/*) proc_ticks "${p#/proc/}" | awk -v c="$c" '{ print c, $1 + $2 }' ;; esac
	done
	[ -n "$SRV_PID" ] && proc_ticks "$SRV_PID" | awk '{ print "smbdirectd.user", $1; print "smbdirectd.sys", $2 }'
	# memory management (faults, reclaim, compaction, THP) by its counters
	awk '$2 ~ /^[0-9]+$/ && $1 !~ /^nr_/ { print "vm." $1, $2 }' /proc/vmstat
	[ -n "$SRV_PID" ] && awk '/ctxt_switches/ { sub(":", "", $1); print "smbdirectd." $1, $2 }' "/proc/$SRV_PID/status" 2>/dev/null
	for p in /sys/class/infiniband/*/ports/1/hw_counters/*; do
		[ -r "$p" ] && echo "rxe.${p##*/} $(cat "$p" 2>/dev/null)"
	done
	# large store copies made on the copy core or kept on the worker
	# (serve --store-copy-cores)
	[ -n "$SRV_PID" ] && stats | jq -r '.total | to_entries[] | select(.key | startswith("store_copies")) | "smbd.\(.key) \(.value)"' 2>/dev/null
	return 0
}
detail_delta() { # BEFORE-FILE AFTER-FILE -> "key=delta ..." (non-zero only)
	awk 'NR == FNR { a[$1] = $2; next } { d = $2 - a[$1]; if (d != 0) printf "%s=%s ", $1, d }' "$1" "$2"
}
# The kernel has oopsed since boot (taint flag D, 128): a module that died
# in a worker (cifs.ko 6.1's smbd_post_send_credits after a disconnect, seen
# in bench runs) leaves the client unable to mount; nothing after it
# measures anything.
kernel_died() { (($(cat /proc/sys/kernel/tainted) & 128)); }
# What one rxe queue pair moves with nothing above it, for a 1 MiB job
# (--bs=1m): perftest's 1 MiB RDMA Writes (a READ's data) or RDMA Reads (a
# WRITE's) with --iodepth of them outstanding, in MB/s (10^6; perftest
# prints MiB/s). Each server's transfers for one mount go through one
# queue pair, so this is the ceiling of the job's row. Empty for other jobs.
rxe_ceiling() { # METRIC FIO-ARGS...
	local metric=$1 tool depth qd=1 a
	shift
	# outstanding Writes are the send queue's depth (-t), Reads their own (-o)
	case $metric in read_mbs) tool=ib_write_bw depth=-t ;; write_mbs) tool=ib_read_bw depth=-o ;; *) return 0 ;; esac
	[[ " $* " == *" --bs=1m "* ]] || return 0
	for a in "$@"; do [[ $a == --iodepth=* ]] && qd=${a#--iodepth=}; done
	command -v "$tool" >/dev/null || return 0
	local port=$((19000 + RANDOM % 1000)) n=$((BENCH_RUNTIME * 16)) srv v
	timeout 120 "$tool" -d rxe0 -x 1 -s 1048576 -n "$n" "$depth" "$qd" -p "$port" >/dev/null 2>&1 &
	srv=$!
	sleep 1
	v=$(timeout 120 "$tool" -d rxe0 -x 1 -s 1048576 -n "$n" "$depth" "$qd" -p "$port" "$IP" 2>/dev/null |
		awk '$1 == 1048576 && NF >= 4 { printf "%.2f", $4 * 1.048576 }' | tail -n 1)
	wait "$srv" 2>/dev/null
	echo "$v"
}
bench_mode() {
	SRV_PORT=5445
	mkdir -p "$MNT"
	start_ksmbd
	head -c $((64 << 20)) /dev/zero >"$STORE/r.dat"
	head -c $((64 << 20)) /dev/zero >"$STORE/w.dat"
	local p srv spec name file metric args v sessions c0
	for spec in "${BENCH_JOBS[@]}"; do
		read -r name file metric args <<<"$spec"
		echo "bench-job: $name $metric $args"
	done
	# BENCH_ALT="serve flags": a third server in every round, smbdirectd
	# with those flags ("smbdirectd-alt"), to compare a setting in one boot;
	# BENCH_ALT_BIN=PATH: that server is this other build (e.g. the commit
	# before a change), to compare two builds in one boot
	local servers="smbdirectd ksmbd"
	if [ -n "${BENCH_ALT:-}${BENCH_ALT_BIN:-}" ]; then
		[ -z "${BENCH_ALT_BIN:-}" ] || [ -x "$BENCH_ALT_BIN" ] || die "BENCH_ALT_BIN=$BENCH_ALT_BIN is not executable"
		servers="smbdirectd smbdirectd-alt ksmbd"
		echo "bench-alt: ${BENCH_ALT_BIN:+binary $BENCH_ALT_BIN }${BENCH_ALT:-}"
	fi
	# 1 MiB jobs: rxe's own ceiling for them, measured in every round
	# beside the servers ("rxe-ceiling", no mount: perftest on rxe0)
	[[ " ${BENCH_JOBS[*]} " == *" --bs=1m "* ]] && servers="$servers rxe-ceiling"
	local order
	for ((p = 1; p <= BENCH_PAIRS; p++)); do
		# A B, B A, A B ...: the server measured first in a round did
		# better in this guest (two builds of smbdirectd swapped between
		# boots: docs/bench-results.md, session 14), so the order
		# alternates and no side always has the first place
		order=$servers
		((p % 2 == 0)) && order=$(printf '%s\n' $servers | tac | tr '\n' ' ')
		for srv in $order; do
			say "pair $p/$BENCH_PAIRS: $srv"
			if [ "$srv" = rxe-ceiling ]; then
				for spec in "${BENCH_JOBS[@]}"; do
					read -r name file metric args <<<"$spec"
					# shellcheck disable=SC2086
					v=$(rxe_ceiling "$metric" $args)
					[ -n "$v" ] && echo "bench: pair=$p server=rxe-ceiling job=$name value=$v"
				done
				continue
			fi
			# shellcheck disable=SC2086
			case $srv in
			smbdirectd) start_server ;;
			smbdirectd-alt) BIN=${BENCH_ALT_BIN:-$BIN} start_server ${BENCH_ALT:-} ;;
			esac
			if ! do_mount 3.1.1 ""; then
				bad "mount ($srv, pair $p)"
				stop_server
				kernel_died && die "the guest kernel oopsed (dmesg: $(dmesg | grep -m1 -E 'BUG:|Oops:')); stopping the bench at pair $p"
				continue
			fi
			if [ $p = 1 ]; then
				grep -q 'SMBDirect (in hex) protocol version' /proc/fs/cifs/DebugData &&
					ok "$srv: the mount's transport is SMB Direct" || bad "$srv: no SMBDirect transport"
			fi
			if [ -n "$SRV_PID" ]; then
				# the mount must have reached smbdirectd (5445), not ksmbd
				sessions=$(stats | jq .sessions 2>/dev/null)
				[ "${sessions:-0}" -ge 1 ] || bad "the mount did not reach smbdirectd (sessions ${sessions:-?})"
			fi
			for spec in "${BENCH_JOBS[@]}"; do
				read -r name file metric args <<<"$spec"
				c0=$(cpu_ticks)
				detail_snap >"$LOG/snap0"
				# shellcheck disable=SC2086
				if fio_run "$name" "$LOG/bench-$p-$srv-$name.json" "$BENCH_RUNTIME" --filename="$MNT/$file" \
					--size=64M --ramp_time=1 $args; then
					v=$(fio_metric "$LOG/bench-$p-$srv-$name.json" "$metric")
				else
					bad "fio $name ($srv, pair $p)"
					v=0
				fi
				echo "bench: pair=$p server=$srv job=$name value=${v:-0}"
				# where the guest's CPU went during the fio run (ramp and start-up included)
				echo "bench-cpu: pair=$p server=$srv job=$name $(cpu_delta "$c0" "$(cpu_ticks)")"
				detail_snap >"$LOG/snap1"
				echo "bench-detail: pair=$p server=$srv job=$name $(detail_delta "$LOG/snap0" "$LOG/snap1")"
				rm -f "$LOG/snap0" "$LOG/snap1"
			done
			[ -n "$SRV_PID" ] && stats >"$LOG/bench-stats-$p-$srv.json"
			do_umount || bad "umount ($srv, pair $p)"
			stop_server
			kernel_died && die "the guest kernel oopsed after $srv's half of pair $p (dmesg: $(dmesg | grep -m1 -E 'BUG:|Oops:')); stopping the bench"
		done
	done
	[ -s "$LOG/bench-stats-1-smbdirectd.json" ] && jq -c '.total' "$LOG/bench-stats-1-smbdirectd.json"
	timeout 30 ksmbd.control -s >/dev/null 2>&1
}

# the kernel log, streamed (a guest kernel oops stops everything else)
dmesg -w 2>/dev/null | sed -u 's/^/kmsg: /' >&2 &
load_modules
case $MODE in
--test) test_mode ;;
--qos) qos_mode ;;
--bench) bench_mode ;;
*) die "unknown mode $MODE" ;;
esac
finish
