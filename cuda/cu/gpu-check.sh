#!/bin/sh
# Runs the cu backend's tests (the backend conformance suite among them)
# and the device->host bandwidth benchmark on this machine's GPU, from the
# binaries beside this script (built by make gpu-check; no Go toolchain
# needed). Needs an NVIDIA driver (libcuda.so.1) and at least one device;
# without them it says so and exits 0.
#
#   ./run [gpubench flags: -device 0 -bytes 268435456 -iters 20]
#
# Set RESIDENCY_CU_ALL_DEVICES=1 to test every device, not the first two.
set -u
cd "$(dirname "$0")" || exit 1
log=gate.log
RESIDENCY_CU_TEST_BINARY=./cu.test ./gate.test -test.v -test.count=1 2>&1 | tee "$log"
status=$(tail -n 1 "$log")
if grep -q -- '--- SKIP: TestCUBackendOnGPU' "$log"; then
	echo "gpu-check: no usable GPU here; nothing run (see the reason above)"
	exit 0
fi
if ! grep -q -- '--- PASS: TestCUBackendOnGPU' "$log"; then
	echo "gpu-check: the cu backend's tests FAILED ($status)"
	exit 1
fi
echo "gpu-check: the cu backend's tests passed"
echo
./gpubench "$@"
