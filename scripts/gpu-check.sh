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
#     both and their ratio (the limit is measured in the same run);
#   - where /usr/bin/python3's torch sees the GPU: the vLLM connector with
#     its KV cache on the GPU (tests/test_vllm_connector.py, 0 wrong
#     bytes) and bench_vllm's rows on the GPU (issue 25: the copies
#     against page-locked host <-> GPU copies, the overlap).
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

# The vLLM connector's GPU path (clients/python): vLLM's KV cache on the
# GPU, the slab page-locked, saves and asynchronous loads on streams of
# their own through device staging buffers. Needs a CUDA build of torch
# for /usr/bin/python3 (Debian's python3-torch is CPU-only: skipped with a
# message there).
if /usr/bin/python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	make build
	(cd clients/python && /usr/bin/python3 -m pytest -q -k 'cuda or staged or pinning' tests/test_vllm_connector.py)
	(cd clients/python && /usr/bin/python3 -m kvtier.bench_vllm --device cuda --kvtier ../../bin/kvtier)
else
	echo "gpu-check: /usr/bin/python3's torch sees no CUDA device: the vLLM connector's GPU path is not checked"
fi
