#!/usr/bin/env bash
# One-call GPU check of the development kernel's 8-bit paths (issue 35; kernels/sparse_mla/next/,
# NOT shipped, never run on a GPU before this script): correctness on the GPU, then the benchmark
# under SM120's limits (bf16 / fp8 / fp8_ds_mla, copy floor, plain-torch peer) for next/ ("after")
# and for the shipped kernel, kernels/sparse_mla/triton_sparse_mla.py ("before", v9). For one H200
# (any CUDA GPU with torch + triton); no vLLM install, no network. Every step has its own time
# limit and the whole stays under 9.5 minutes. Results (logs, junit XML, JSON) go under $OUT.
#
#   OUT=/some/dir bash benchmarks/sparse_mla/gpu_recheck_fp8.sh
#
# AFTER / BEFORE override the two kernel files (see kernels/sparse_mla/next/README.md and
# NOTES.md v10). next/ is promoted into the shipped file, and the patch variants regenerated,
# only once these numbers are in.
set -uo pipefail
out="${OUT:-./gpu-recheck-fp8}"
after="${AFTER:-kernels/sparse_mla/next/triton_sparse_mla.py}"   # the development kernel
before="${BEFORE:-kernels/sparse_mla/triton_sparse_mla.py}"       # the shipped kernel (v9)
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
for f in "$after" "$before"; do
  [[ -f "$f" ]] || { echo "no kernel file $f" | tee -a "$out/summary.txt"; exit 2; }
done
echo "after: $after; before: $before" | tee -a "$out/summary.txt"
B="python benchmarks/sparse_mla/bench_decode.py --no-dense --heads 8,16 --batches 1,8,32,64,128"
A="$B --kernel $after"

# 1. correctness of next/ on the GPU: every fp8_ds_mla case (CPU shapes, GLM-5 shapes, CUDA-graph
#    replay, the SM120 configs), the per-tensor fp8 and graph cases of next/'s test file.
step kernel-tests 220 env SPARSE_MLA_NEXT_KERNEL="$after" python -m pytest -q -p no:cacheprovider -p no:randomly \
  tests/kernels/test_sparse_mla_ds.py tests/kernels/test_sparse_mla_next.py \
  -k "(ds_mla or 8bit or fp8 or cuda_graph) and not compile_within" --junitxml "$out/kernel-tests.xml"
# 2. the benchmark as an SM120 part would choose (99 KB per program, mma.sync), next/
step bench-sm120 170 $A --sm120-limits --kv bf16,fp8,fp8_ds_mla --repeat 3 --json "$out/bench-sm120.json"
# 3. the same shapes with the shipped kernel (bf16 and per-tensor fp8: it has no fp8_ds_mla)
step bench-sm120-before 70 $B --sm120-limits --kv bf16,fp8 --no-peer --kernel "$before" \
  --json "$out/bench-sm120-before.json"
# 4. next/'s 8-bit configs against each other (which should be the default), SM120 limits
step sweep-sm120 80 $A --sm120-limits --kv fp8,fp8_ds_mla --sweep --sweep-batches 32,128 --no-table --no-peer \
  --json "$out/sweep-sm120.json"
# 5. the H200's own limits, for the record (the rope-free D 512 rows after it if time is left)
step bench-device 40 $A --kv bf16,fp8,fp8_ds_mla --no-peer --json "$out/bench-device.json"
step bench-sm120-d512 50 $A --sm120-limits --rope 0 --kv bf16,fp8,fp8_ds_mla --no-peer --json "$out/bench-sm120-d512.json"
# 6. only if time is left (not counted in the status otherwise): the rest of main's tests run
#    against next/ (bf16 GLM-5 shapes, named configs)
(( $(left) >= 20 )) && step kernel-tests-rest 60 env SPARSE_MLA_NEXT_KERNEL="$after" python -m pytest -q -p no:cacheprovider -p no:randomly \
  tests/kernels/test_sparse_mla_next.py -k "not (ds_mla or 8bit or fp8 or cuda_graph) and not compile_within" \
  --junitxml "$out/kernel-tests-rest.xml"
rm -rf "$out/triton-cache"
echo "status $status, $(( $(date +%s) - start ))s" | tee -a "$out/summary.txt"
exit $status
