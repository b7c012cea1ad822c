# Sourced by tools/quickstart and tools/run-tests: install the Debian
# packages kvcache builds with, if any is missing.
KVC_DEPS="gcc meson ninja-build pkg-config protobuf-c-compiler libprotobuf-c-dev
libjson-c-dev libxxhash-dev liburing-dev libzstd-dev libsodium-dev libmicrohttpd-dev libsystemd-dev scdoc iproute2
python3 python3-dev libucx-dev libibverbs-dev libnuma-dev libcurl4-openssl-dev etcd-server"

kvc_install_deps() {
	missing=
	for p in $KVC_DEPS "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
			missing="$missing $p"
	done
	[ -z "$missing" ] && return 0
	echo "Installing:$missing"
	if [ "$(id -u)" = 0 ]; then
		sudo=
	elif command -v sudo >/dev/null; then
		sudo=sudo
	else
		echo "Missing packages:$missing; run as root or install them." >&2
		return 1
	fi
	$sudo apt-get update -q
	# shellcheck disable=SC2086
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q $missing
}
