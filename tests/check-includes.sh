#!/bin/sh
# The dependency rules of docs/ARCHITECTURE.rst, checked by name: every
# #include "..." of a directory must name a header of a directory it may
# use.  (Meson also gives each daemon library only the include directories
# it may use; this catches what a shared directory would let through.)
set -eu
cd "${MESON_SOURCE_ROOT:-$(dirname "$0")/..}"

# where a header lives: its directory, as used in the rules below
where() {
	case $1 in
	kvc-config.h) echo build; return ;;
	kvcache.pb-c.h | peer.pb-c.h) echo proto; return ;;
	kvcache/kvcache.h) echo public; return ;;
	esac
	for d in daemon/base daemon/core daemon/core/private daemon/local daemon/disk daemon/cluster daemon/master daemon/metrics \
		daemon net proto \
		shmem client common \
		client/include tools tools/bench tests/common; do
		[ -f "$d/$1" ] && { echo "$d"; return; }
	done
	echo unknown
}

# allowed DIR: the directories a source directory may include from
allowed() {
	case $1 in
	daemon/base) echo "daemon/base build common" ;;
	daemon/core) echo "daemon/base daemon/core daemon/core/private daemon shmem proto build common" ;;
	daemon/core/private) echo "daemon/base daemon/core daemon/core/private daemon shmem proto build common" ;;
	daemon/local) echo "daemon/base daemon/core daemon/local daemon shmem proto build common" ;;
	daemon/disk) echo "daemon/base daemon/core daemon/disk daemon shmem proto build common" ;;
	daemon/cluster) echo "daemon/base daemon/core daemon/cluster daemon/metrics daemon net proto shmem build common" ;;
	daemon/master) echo "daemon/base daemon/master daemon/metrics net proto build common" ;;
	daemon/metrics) echo "daemon/metrics build common" ;;
	daemon) echo "daemon/base daemon/core daemon/local daemon/disk daemon/cluster daemon/metrics daemon net shmem proto build common" ;;
	net) echo "net proto build common" ;;
	proto) echo "proto build common" ;;
	shmem) echo "shmem build common" ;;
	client) echo "client client/include public shmem proto build common" ;;
	tools) echo "tools public build common" ;;
	tools/bench) echo "tools tools/bench public build net common" ;;
	esac
}

bad=0
for dir in daemon/base daemon/core daemon/core/private daemon/local daemon/disk daemon/cluster daemon/master daemon/metrics daemon \
	net proto shmem \
	client tools tools/bench; do
	ok=$(allowed "$dir")
	for f in "$dir"/*.c "$dir"/*.h; do
		[ -f "$f" ] || continue
		for inc in $(sed -n 's/^#include "\(.*\)".*/\1/p' "$f"); do
			home=$(where "$inc")
			case " $ok " in
			*" $home "*) ;;
			*)
				echo "$f includes \"$inc\" from $home: $dir may use only: $ok" >&2
				bad=1
				;;
			esac
		done
	done
done
# core's private headers (daemon/core/private: the index, the tiers'
# internals, the store's fields) are core's own; every other part of the
# daemon uses them through store.h (their include paths do not have them
# either), and so do the tools and the fuzzers
for f in daemon/*.c daemon/*.h daemon/local/*.c daemon/local/*.h daemon/disk/*.c \
	daemon/disk/*.h daemon/cluster/*.c daemon/cluster/*.h daemon/master/*.c \
	daemon/metrics/*.c tests/fuzz/*.c tests/fuzz/*.h; do
	[ -f "$f" ] || continue
	for inc in $(sed -n 's/^#include "\(.*\)".*/\1/p' "$f"); do
		case $inc in
		tier.h | index.h | store-private.h)
			echo "$f includes \"$inc\": core's own; use store.h" >&2
			bad=1
			;;
		esac
	done
done

[ "$bad" = 0 ] && echo "includes: every directory uses only what it may"
exit "$bad"
