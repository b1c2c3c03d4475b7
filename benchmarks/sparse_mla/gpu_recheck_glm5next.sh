#!/usr/bin/env bash
# One-call GPU re-check of the Triton sparse-MLA kernel and backend after the glm5_next block-size
# change (issue 27), for one H200 (or any CUDA GPU with torch + triton). Needs no vLLM install and
# no network: the patch's GPU check loads only the two files the 0.31.0 variant ships (backend and
# kernel; byte-identical to patches/vllm/triton-sparse-mla/src/triton_mla_sparse_v24.py and
# kernels/sparse_mla/triton_sparse_mla.py, which this script lays out as a minimal "patched tree").
# Results (junit XML + logs) go under $OUT (default ./gpu-recheck). Expect a few minutes.
#
#   OUT=/some/dir bash benchmarks/sparse_mla/gpu_recheck_glm5next.sh
set -uo pipefail
out="${OUT:-./gpu-recheck}"
mkdir -p "$out"
tree="$(mktemp -d)"
mkdir -p "$tree/vllm/v1/attention/backends/mla" "$tree/vllm/v1/attention/ops"
cp patches/vllm/triton-sparse-mla/src/triton_mla_sparse_v24.py "$tree/vllm/v1/attention/backends/mla/triton_mla_sparse.py"
cp kernels/sparse_mla/triton_sparse_mla.py "$tree/vllm/v1/attention/ops/triton_sparse_mla.py"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv > "$out/gpu.txt" 2>&1
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$out/gpu.txt" 2>&1
status=0
# 1. the patch's GPU check: D 576/h16, D 512/h8, D 512/h16 x fp16/bf16 x adjacent/strided blocks x
#    device/SM120 configs x page 64 / page 1024 (the glm5_next group's kernel block): 48 cases.
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PATCHCTL_PATCHED_TREE="$tree" PATCHCTL_PRISTINE_TREE="$tree" PATCHCTL_ENGINE=vllm PATCHCTL_ENGINE_VERSION=0.33.0 \
  timeout 300 python -m pytest -q -p no:cacheprovider -p patchctl.smoke.pytest_plugin \
  --rootdir patches/vllm/triton-sparse-mla/checks \
  patches/vllm/triton-sparse-mla/checks/test_gpu_forward.py \
  --junitxml "$out/patch-gpu.xml" > "$out/patch-gpu.log" 2>&1 || status=1
# 2. the kernel's own GPU tests (rope-free, CUDA-graph capture, full GLM-5 shapes).
timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_sparse_mla.py \
  -k "rope_free or cuda_graph_capture or glm5_full_shapes" \
  --junitxml "$out/kernel-gpu.xml" > "$out/kernel-gpu.log" 2>&1 || status=1
tail -n 3 "$out/patch-gpu.log" "$out/kernel-gpu.log"
rm -rf "$tree"
exit $status
