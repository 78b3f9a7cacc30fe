#!/usr/bin/env bash
# build.sh SDK_DIR OUT_DIR: builds the fake driver (fakecuda.c) as
# OUT_DIR/libcuda.so.1. Every other symbol of the real driver's stub is
# defined too, failing with CUDA_ERROR_NOT_SUPPORTED, so that binaries
# linked against the stub load.
set -euo pipefail
sdk=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
gcc -O1 -fPIC -Wall -Wno-deprecated-declarations -I"$sdk/include" -c "$here/fakecuda.c" -o "$out/fakecuda.o"
nm --defined-only "$out/fakecuda.o" | awk '$2 == "T" { print $3 }' | sort >"$out/implemented.txt"
nm -D --defined-only "$sdk/stubs/libcuda.so" | awk '$2 == "T" { print $3 }' | sort |
	comm -23 - "$out/implemented.txt" |
	awk '{ printf "int %s(void) { return 801; }\n", $1 }' >"$out/unsupported.c"
gcc -O1 -fPIC -c "$out/unsupported.c" -o "$out/unsupported.o"
gcc -shared -Wl,-soname,libcuda.so.1 -o "$out/libcuda.so.1" "$out/fakecuda.o" "$out/unsupported.o" -lpthread
echo "fakedriver: $out/libcuda.so.1 ($(wc -l <"$out/implemented.txt") calls implemented)"
