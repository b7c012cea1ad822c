#!/bin/sh
# Regression tests for how kvcached and kvcachectl treat their environment:
# closed standard streams, FIFOs as config files, impossible sizes, a disk
# tier that cannot be written.  One case per run: test-tools.sh CASE.
set -eu

: "${KVCACHED:?run through meson test}" "${KVCACHECTL:?run through meson test}"
case_name=${1:?usage: test-tools.sh CASE}
dir=$(mktemp -d /tmp/kvc-tools-XXXXXX)
sock="$dir/kvcached.sock"
pid=
mounted=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	[ -n "$mounted" ] && umount "$mounted" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; [ -f "$dir/err" ] && cat "$dir/err" >&2; exit 1; }
ctl() { "$KVCACHECTL" -s "$sock" "$@"; }
# expect STATUS CMD...: run CMD (at most 20 s) and check its exit status
expect() {
	want=$1; shift
	set +e; timeout 20 "$@" >"$dir/out" 2>"$dir/err"; got=$?; set -e
	[ "$got" = "$want" ] || fail "'$*' exited $got, expected $want"
}
start_daemon() {
	"$KVCACHED" --socket "$sock" --dram-size 16MB --hugepages off --default-kv-lease-ttl 0 \
		"$@" 2>"$dir/daemon.log" &
	pid=$!
	i=0
	until [ -S "$sock" ] && ctl status >/dev/null 2>&1; do
		i=$((i + 1)); [ $i -lt 500 ] || fail "daemon did not start"; sleep 0.01
	done
}

case $case_name in
clients-out-of-fds)
	# kvcached out of file descriptors: clients past them are refused
	# (a descriptor kept in reserve takes each and closes it) and said
	# once, not left waiting to wake the loop again and again (which
	# logged a line each time); once they go, a client is served
	start_daemon
	open_fds=$(ls "/proc/$pid/fd" | wc -l)
	hard=$(awk '/^Max open files/ { print $5 }' "/proc/$pid/limits")
	prlimit --pid "$pid" --nofile=$((open_fds + 6)):"$hard" || fail "prlimit"
	python3 "$(dirname "$0")/hello-flood.py" unix "$sock" 60 >"$dir/conns" || fail "connect"
	read -r made open <"$dir/conns"
	echo "out of descriptors: $open of $made clients open"
	[ "$made" = 60 ] && [ "$open" -lt 60 ] || fail "clients past the descriptors were kept"
	prlimit --pid "$pid" --nofile="$hard":"$hard"
	ctl status >/dev/null || fail "a client after the others went"
	n=$(grep -c "refusing clients" "$dir/daemon.log" || true)
	[ "$n" -ge 1 ] && [ "$n" -le 2 ] || fail "refusals said $n times"
	;;
config-fifo)
	# a FIFO as --config or MOONCAKE_CONFIG_PATH is refused at once
	mkfifo "$dir/fifo"
	expect 2 "$KVCACHED" --socket "$sock" --config "$dir/fifo"
	grep -q "not a regular file" "$dir/err" || fail "no reason given"
	expect 2 env MOONCAKE_CONFIG_PATH="$dir/fifo" "$KVCACHED" --socket "$sock"
	expect 2 "$KVCACHED" --socket "$sock" --config /dev/zero
	;;
tiers-exceed-memory)
	expect 2 "$KVCACHED" --socket "$sock" --dram-size 60T
	grep -q "exceed this machine's memory" "$dir/err" || fail "no reason given"
	grep -q -- "--allow-overcommit" "$dir/err" || fail "no way out named"
	expect 2 "$KVCACHED" --socket "$sock" --dram-size 1G --device-size 60T
	printf '{"global_segment_size": "60T"}' >"$dir/c.json"
	expect 2 "$KVCACHED" --socket "$sock" --config "$dir/c.json"
	;;
numa)
	# --numa-node: a node that is not there is refused; node 0 binds the
	# tiers (numa_maps) and shows in status; auto without an RDMA device
	# leaves placement alone
	if ! "$KVCACHED" --version | grep -q "^numa yes"; then
		expect 2 "$KVCACHED" --socket "$sock" --numa-node 0
		grep -q "without libnuma" "$dir/err" || fail "no reason given"
		exit 0
	fi
	expect 2 "$KVCACHED" --socket "$sock" --numa-node 4096 --hugepages off --dram-size 16MB
	grep -q "no such node" "$dir/err" || fail "a missing node not explained"
	expect 2 "$KVCACHED" --socket "$sock" --numa-node two --hugepages off --dram-size 16MB
	start_daemon --numa-node 0
	ctl status | grep -q "^numa: *node 0 (memory and threads bound)" || fail "status: $(ctl status)"
	ctl --json status | grep -q '"numa_node": *0' || fail "json status"
	grep "kvcache-dram" "/proc/$pid/numa_maps" | grep -q "bind:0" || fail "the dram tier is not bound"
	head -c 70000 /dev/urandom >"$dir/v"
	ctl put k "$dir/v" && ctl get k "$dir/v.out" && cmp "$dir/v" "$dir/v.out" || fail "bytes"
	kill "$pid"; wait "$pid" || true; pid=
	start_daemon --numa-node auto
	ctl status | grep -q "^numa: *not bound" || fail "auto without a device bound something"
	;;
bench-running-daemon)
	# kvcache-bench against a daemon someone runs, with its default lease
	# (a get leases what it read for 10 s): every cell runs, twice over
	start_daemon --dram-size 256MB --default-kv-lease-ttl 10000
	for round in 1 2; do
		expect 0 "$KVCACHE_BENCH" local --socket "$sock" --duration 0.02 --sizes 4K,64K --json
		grep -q '"op": *"acquire"' "$dir/out" || fail "round $round: no acquire cell: $(cat "$dir/err")"
	done
	;;
prefault)
	# --prefault (auto, the default, is on, 4 KiB pages too) faults the
	# whole dram tier in (RssShmem reaches its size) without changing a
	# stored byte; off does not
	expect 2 "$KVCACHED" --socket "$sock" --prefault sometimes
	grep -q "expected auto, on or off" "$dir/err" || fail "bad --prefault not explained"
	start_daemon --dram-size 256MB --log-level info --prefault off
	head -c 100000 /dev/urandom >"$dir/v"
	ctl put early "$dir/v"
	sleep 0.3
	rss=$(awk '/^RssShmem/ { print $2 }' "/proc/$pid/status")
	[ "$rss" -lt 65536 ] || fail "--prefault off faulted $rss KiB in"
	kill "$pid"; wait "$pid" || true; pid=
	start_daemon --dram-size 256MB --log-level info
	ctl put early "$dir/v"
	i=0
	until grep -q "dram tier: [0-9]* MiB faulted in" "$dir/daemon.log"; do
		i=$((i + 1)); [ $i -lt 200 ] || fail "never faulted in"; sleep 0.1
	done
	rss=$(awk '/^RssShmem/ { print $2 }' "/proc/$pid/status")
	[ "$rss" -ge 262144 ] || fail "RssShmem $rss KiB after prefaulting 256 MiB"
	ctl get early "$dir/v.out"
	cmp "$dir/v" "$dir/v.out" || fail "a byte stored before the prefault changed"
	;;
flush-readonly-dir)
	mkdir "$dir/disk"
	mount -t tmpfs -o ro,size=4m tmpfs "$dir/disk" 2>/dev/null || { echo "no mount(2) here"; exit 77; }
	mounted="$dir/disk"
	start_daemon --disk-dir "$dir/disk"
	printf 'value' | ctl put k1 -
	expect 4 "$KVCACHECTL" -s "$sock" flush
	grep -q "could not be written" "$dir/err" || fail "flush gave no reason"
	grep -q "Read-only file system" "$dir/err" || fail "flush did not name the error"
	# still served from memory
	expect 0 "$KVCACHECTL" -s "$sock" get k1 -
	[ "$(cat "$dir/out")" = value ] || fail "value changed"
	;;
put-stdin-closed)
	start_daemon
	expect 4 sh -c "exec '$KVCACHECTL' -s '$sock' put k - <&-"
	expect 1 "$KVCACHECTL" -s "$sock" exists k
	;;
get-stdout-closed)
	start_daemon
	printf 'secret' | ctl put k -
	expect 4 sh -c "exec '$KVCACHECTL' -s '$sock' get k >&-"
	# the value did not go into the control socket: the daemon is fine
	expect 0 "$KVCACHECTL" -s "$sock" get k -
	[ "$(cat "$dir/out")" = secret ] || fail "value changed"
	expect 0 "$KVCACHECTL" -s "$sock" status
	;;
status-stdout-closed)
	start_daemon
	expect 4 sh -c "exec '$KVCACHECTL' -s '$sock' status >&-"
	expect 4 sh -c "exec '$KVCACHECTL' -s '$sock' --json stats >&-"
	expect 4 sh -c "exec '$KVCACHECTL' -s '$sock' status >/dev/full"
	;;
ls-long-prefix)
	start_daemon
	long=$(head -c 512 /dev/zero | tr '\0' a)
	expect 2 "$KVCACHECTL" -s "$sock" ls "$long"
	expect 0 "$KVCACHECTL" -s "$sock" ls "$(head -c 511 /dev/zero | tr '\0' a)"
	;;
json-exists-leak)
	# under the sanitizers a leak fails the command
	start_daemon
	printf 'v' | ctl put k -
	expect 0 "$KVCACHECTL" -s "$sock" --json exists k
	grep -q '"exists": true' "$dir/out" || fail "wrong output"
	expect 1 "$KVCACHECTL" -s "$sock" --json exists missing
	;;
evict-all-with-disk)
	# evicting every tier demotes to the disk tier; only naming the disk
	# tier drops records
	mkdir "$dir/disk"
	start_daemon --disk-dir "$dir/disk"
	head -c 100000 /dev/urandom >"$dir/blob"
	for i in 1 2 3; do "$KVCACHECTL" -s "$sock" put "k$i" "$dir/blob"; done
	expect 0 "$KVCACHECTL" -s "$sock" flush
	expect 0 "$KVCACHECTL" -s "$sock" evict --all
	grep -q "evicted 3 objects" "$dir/out" || fail "memory copies not evicted"
	expect 0 "$KVCACHECTL" -s "$sock" get k2 "$dir/back"
	cmp "$dir/blob" "$dir/back" || fail "bytes differ after demotion"
	expect 0 "$KVCACHECTL" -s "$sock" evict --all
	expect 0 "$KVCACHECTL" -s "$sock" evict --tier disk --all
	grep -q "evicted 3 objects" "$dir/out" || fail "records not dropped"
	expect 1 "$KVCACHECTL" -s "$sock" exists k1
	[ -z "$(ls "$dir/disk")" ] || sleep 0.2
	[ -z "$(ls "$dir/disk")" ] || fail "records left behind: $(ls "$dir/disk")"
	;;
*)
	fail "no case named $case_name"
	;;
esac
echo "ok $case_name"
