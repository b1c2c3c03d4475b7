#!/usr/bin/env bash
# One-call GPU check of the sparse-MLA kernel's 8-bit paths (issue 35): correctness on the GPU,
# then the benchmark under SM120's limits (bf16 / fp8 / fp8_ds_mla, copy floor, plain-torch peer)
# for the kernel of this tree and, when given, the kernel before the change. For one H200 (any
# CUDA GPU with torch + triton); no vLLM install, no network. Every step has its own time limit
# and the whole stays under 9.5 minutes. Results (logs, junit XML, JSON) go under $OUT.
#
#   git show 3ddbbe4:kernels/sparse_mla/triton_sparse_mla.py > build/bench-before/triton_sparse_mla.py  # here
#   OUT=/some/dir BEFORE=build/bench-before/triton_sparse_mla.py bash benchmarks/sparse_mla/gpu_recheck_fp8.sh
#
# (the device tool: carry ["build/bench-before"]; see kernels/sparse_mla/NOTES.md v10).
set -uo pipefail
out="${OUT:-./gpu-recheck-fp8}"
before="${BEFORE:-}"
mkdir -p "$out"
start=$(date +%s)
left() { echo $(( 570 - ($(date +%s) - start) )); }  # seconds left of the 9.5-minute budget
step() {  # step NAME SECONDS CMD...: run with min(SECONDS, what is left); log to $out/NAME.log
  local name=$1 want=$2; shift 2
  local t; t=$(left); (( t > want )) && t=$want
  if (( t < 20 )); then echo "SKIPPED $name: no time left" | tee -a "$out/summary.txt"; status=1; return; fi
  echo "== $name (limit ${t}s)" | tee -a "$out/summary.txt"
  timeout "$t" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc after $(( $(date +%s) - start ))s" | tee -a "$out/summary.txt"
  (( rc != 0 )) && status=1
  tail -n 4 "$out/$name.log" >> "$out/summary.txt"
}
status=0
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$out/gpu.txt" 2>&1
export TRITON_CACHE_DIR="$out/triton-cache"  # compiled once here, reused by the benchmark runs
B="python benchmarks/sparse_mla/bench_decode.py --no-dense --heads 8,16 --batches 1,8,32,64,128"

# 1. correctness on the GPU: every fp8_ds_mla case (CPU shapes, GLM-5 shapes, CUDA-graph replay,
#    the SM120 configs), the per-tensor fp8 and graph cases of the main test file.
step kernel-tests 220 python -m pytest -q -p no:cacheprovider -p no:randomly \
  tests/kernels/test_sparse_mla_ds.py tests/kernels/test_sparse_mla.py \
  -k "ds_mla or 8bit or fp8 or cuda_graph" --junitxml "$out/kernel-tests.xml"
# 2. the benchmark as an SM120 part would choose (99 KB per program, mma.sync), this tree's kernel
step bench-sm120 170 $B --sm120-limits --kv bf16,fp8,fp8_ds_mla --repeat 3 --json "$out/bench-sm120.json"
# 3. the same shapes with the kernel before the change (bf16 and per-tensor fp8: it had no fp8_ds_mla)
if [[ -n "$before" && -f "$before" ]]; then
  step bench-sm120-before 70 $B --sm120-limits --kv bf16,fp8 --no-peer --kernel "$before" \
    --json "$out/bench-sm120-before.json"
else
  echo "no BEFORE kernel given: the before column comes from NOTES.md" | tee -a "$out/summary.txt"
fi
# 4. the 8-bit kernel's configs against each other (which should be the default), SM120 limits
step sweep-sm120 80 $B --sm120-limits --kv fp8,fp8_ds_mla --sweep --sweep-batches 32,128 --no-table --no-peer \
  --json "$out/sweep-sm120.json"
# 5. the H200's own limits, for the record (the rope-free D 512 rows after it if time is left)
step bench-device 40 $B --kv bf16,fp8,fp8_ds_mla --no-peer --json "$out/bench-device.json"
step bench-sm120-d512 50 $B --sm120-limits --rope 0 --kv bf16,fp8,fp8_ds_mla --no-peer --json "$out/bench-sm120-d512.json"
rm -rf "$out/triton-cache"
echo "status $status, $(( $(date +%s) - start ))s" | tee -a "$out/summary.txt"
exit $status
