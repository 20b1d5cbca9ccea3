#!/usr/bin/env bash
# GPU check of the cuda L1 pool, for a machine with an NVIDIA GPU and the
# CUDA runtime (libcudart.so*) on the loader path. CI has no GPU; this is
# what a release is checked with by hand.
#
# It builds the package with the `cuda` tag, reserves hugepages and mounts
# hugetlbfs for the L2 slab (the tests fall back to /dev/shm, and say so,
# where the kernel refuses), then:
#   - runs the Pool v1 conformance suite against the cuda pool (pinned
#     slab, device memory, copies both ways, every byte verified);
#   - checks that a slab larger than the registration ceiling is pinned in
#     pieces and that a copy straddling two pieces is refused;
#   - moves 64 pages of 2.75 MiB each way through the pool and the same
#     bytes with cudaMemcpy from cudaMallocHost memory, and prints GB/s of
#     both and their ratio (the limit is measured in the same run).
# Usage: scripts/gpu-check.sh [go test flags...]
set -euo pipefail
cd "$(dirname "$0")/.."

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi not found; trying the CUDA runtime anyway"
if ! ldconfig -p 2>/dev/null | grep -q 'libcudart\.so'; then
	echo "note: ldconfig lists no libcudart.so*; set LD_LIBRARY_PATH to the CUDA toolkit's lib64 if the open fails"
fi
go version
go vet -tags cuda ./tiers/l1cuda
go test -tags cuda -count=1 -v -run 'GPU' -bench 'GPU' -benchtime 10x "$@" ./tiers/l1cuda 2>&1 | tee /tmp/kvtier-gpu-check.log
grep -q '^gpu-check:' /tmp/kvtier-gpu-check.log || { echo "gpu-check: the benchmark printed no figures" >&2; exit 1; }
