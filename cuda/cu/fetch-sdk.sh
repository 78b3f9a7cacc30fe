#!/usr/bin/env bash
# fetch-sdk.sh CACHE_DIR
#
# Puts what the `cuda` build tag needs from NVIDIA into CACHE_DIR, outside
# the repository: cuda.h (CACHE_DIR/include/cuda.h) and the link-time stub
# of the driver library (CACHE_DIR/stubs/libcuda.so). Both come from
# Debian's nvidia-cuda-dev package (section non-free), fetched with apt
# through a private apt configuration under CACHE_DIR/apt: a sources list
# of our own with `contrib non-free` enabled, its own package lists and
# download cache. The system's apt sources, lists and dpkg state are never
# modified, and no root is needed.
#
# NVIDIA's license does not allow redistributing these files: they live in
# the cache only and are never committed.
#
# The header must be older than CUDA 13: gorgonia.org/cu v0.9.6 calls
# cuCtxCreate with three arguments, and CUDA 13's cuda.h maps cuCtxCreate
# to cuCtxCreate_v4, which takes four. Debian 12 (bookworm) serves CUDA
# 11.8 (11.8.89~11.8.0-5~deb12u1), which is what this was written and
# checked against; a CUDA 13 header is refused with a message.
#
# Idempotent: when CACHE_DIR/.complete exists and both files are in place it
# prints their location and exits without touching the network.
#
# Environment: RESIDENCY_DEBIAN_MIRROR (default: the Debian mirror of this
# machine's apt sources, else http://deb.debian.org/debian),
# RESIDENCY_DEBIAN_SUITE (default: VERSION_CODENAME of /etc/os-release).
set -euo pipefail

die() {
	echo "fetch-sdk: $*" >&2
	exit 1
}

[ $# -eq 1 ] || die "usage: $0 CACHE_DIR"
cache=$1
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

if [ -f "$cache/.complete" ] && [ -f "$cache/include/cuda.h" ] && [ -f "$cache/stubs/libcuda.so" ]; then
	echo "fetch-sdk: cached: $(cat "$cache/.complete")"
	exit 0
fi

command -v apt-get >/dev/null || die "apt-get not found: the cuda build needs Debian's nvidia-cuda-dev (or set CGO_CFLAGS/CGO_LDFLAGS to a CUDA toolkit yourself)"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found"

multiarch=$(gcc -print-multiarch 2>/dev/null || true)
[ -n "$multiarch" ] || multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || true)
[ -n "$multiarch" ] || die "cannot tell this machine's multiarch triplet (gcc -print-multiarch gave nothing)"

suite=${RESIDENCY_DEBIAN_SUITE:-}
if [ -z "$suite" ] && [ -r /etc/os-release ]; then
	suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
fi
[ -n "$suite" ] || die "cannot tell the Debian suite (no VERSION_CODENAME in /etc/os-release); set RESIDENCY_DEBIAN_SUITE"

mirror=${RESIDENCY_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
	# The first Debian archive URI of the system's sources (deb822 or
	# one-line format), so that a machine behind a local mirror keeps
	# using it.
	mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
		awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) { print $i; exit } }' || true)
	if [ -z "$mirror" ]; then
		mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
			awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:.*\/debian\/?$/) { print $i; exit } }' || true)
	fi
	mirror=${mirror:-http://deb.debian.org/debian}
fi
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$keyring" ] || die "$keyring not found (package debian-archive-keyring)"

apt_dir=$cache/apt
rm -rf "$apt_dir"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$apt_dir/sources.list.d" "$apt_dir/debs"
cat >"$apt_dir/sources.list" <<EOF
deb [signed-by=$keyring] $mirror $suite contrib non-free
deb [signed-by=$keyring] $mirror $suite-updates contrib non-free
EOF
apt_opts=(
	-o "Dir::Etc::SourceList=$apt_dir/sources.list"
	-o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
	-o "Dir::State::Lists=$apt_dir/lists"
	-o "Dir::Cache=$apt_dir"
	-o "Dir::Cache::archives=$apt_dir/archives"
	-o "Debug::NoLocking=1"
	-o "APT::Get::List-Cleanup=0"
)
if [ "$(id -u)" = 0 ]; then
	# Downloads into a directory the _apt user cannot write would only
	# produce a warning; say plainly that root downloads.
	apt_opts+=(-o "APT::Sandbox::User=root")
fi

echo "fetch-sdk: apt-get update ($mirror $suite{,-updates} contrib non-free, private lists in $apt_dir)"
if ! apt-get "${apt_opts[@]}" -q update >"$apt_dir/update.log" 2>&1; then
	cat "$apt_dir/update.log" >&2
	die "apt-get update failed (is $mirror reachable?); see above"
fi
if grep -q '^[WE]:' "$apt_dir/update.log"; then
	grep '^[WE]:' "$apt_dir/update.log" >&2
fi

echo "fetch-sdk: candidates:"
apt-cache "${apt_opts[@]}" madison nvidia-cuda-dev | sed 's/^/fetch-sdk:   /' || true
version=$(apt-cache "${apt_opts[@]}" policy nvidia-cuda-dev | awk '/Candidate:/ { print $2 }')
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
	die "nvidia-cuda-dev has no candidate in $mirror $suite contrib non-free"
fi
major=${version%%.*}
case $major in
'' | *[!0-9]*) die "cannot read the CUDA version from nvidia-cuda-dev $version" ;;
esac
if [ "$major" -ge 13 ]; then
	die "nvidia-cuda-dev $version is CUDA $major: its cuda.h maps cuCtxCreate to cuCtxCreate_v4 (four arguments), which gorgonia.org/cu v0.9.6 does not compile against; point RESIDENCY_DEBIAN_SUITE at a suite with CUDA 11.x or 12.x (bookworm serves 11.8)"
fi

echo "fetch-sdk: apt-get download nvidia-cuda-dev=$version"
(cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" -q download "nvidia-cuda-dev=$version" >"$apt_dir/download.log" 2>&1) || {
	cat "$apt_dir/download.log" >&2
	die "apt-get download nvidia-cuda-dev=$version failed; see above"
}
deb=$(ls "$apt_dir"/debs/nvidia-cuda-dev_*.deb 2>/dev/null | head -n 1)
[ -n "$deb" ] || die "apt-get download left no nvidia-cuda-dev .deb in $apt_dir/debs"

echo "fetch-sdk: extracting cuda.h and stubs/libcuda.so from $(basename "$deb") ($(du -h "$deb" | cut -f1))"
tmp=$cache/extract.tmp
rm -rf "$tmp"
mkdir -p "$tmp"
header=./usr/include/cuda.h
stub=./usr/lib/$multiarch/stubs/libcuda.so
# tar stops reading once both members were found (--occurrence); dpkg-deb
# then dies of SIGPIPE, so its status is not used: the files are checked.
set +o pipefail
dpkg-deb --fsys-tarfile "$deb" 2>/dev/null | tar -x -C "$tmp" --occurrence=1 "$header" "$stub" 2>"$tmp.log" || true
set -o pipefail
[ -f "$tmp/$header" ] || { cat "$tmp.log" >&2; die "$header is not in $(basename "$deb")"; }
[ -f "$tmp/$stub" ] || { cat "$tmp.log" >&2; die "$stub is not in $(basename "$deb")"; }

cuda_version=$(awk '$1 == "#define" && $2 == "CUDA_VERSION" { print $3; exit }' "$tmp/$header")
case $cuda_version in
'' | *[!0-9]*) die "no CUDA_VERSION in the extracted cuda.h" ;;
esac
if [ "$cuda_version" -ge 13000 ]; then
	die "the extracted cuda.h is CUDA_VERSION $cuda_version (13 or newer); gorgonia.org/cu v0.9.6 needs an older header"
fi
if command -v readelf >/dev/null; then
	soname=$(readelf -d "$tmp/$stub" | awk '/SONAME/ { gsub(/[][]/, "", $NF); print $NF }')
	[ "$soname" = "libcuda.so.1" ] || die "the stub's SONAME is '$soname', want libcuda.so.1"
fi

rm -rf "$cache/include" "$cache/stubs"
mkdir -p "$cache/include" "$cache/stubs"
mv "$tmp/$header" "$cache/include/cuda.h"
mv "$tmp/$stub" "$cache/stubs/libcuda.so"
rm -rf "$tmp" "$tmp.log" "$apt_dir/debs" "$apt_dir/archives"
echo "nvidia-cuda-dev $version (CUDA_VERSION $cuda_version) from $mirror $suite, $multiarch" >"$cache/.complete"
echo "fetch-sdk: done: $(cat "$cache/.complete")"
