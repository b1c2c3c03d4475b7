"""The V1 worker's slot-mapping Triton kernel (`ComputeSlotMappingKernel.kernel` in
vllm/v1/worker/block_table.py) on a CPU, under TRITON_INTERPRET=1: a token whose block index lies
past its request's block-table row must map to PAD_ID, not read the next request's row.

The kernel is taken from the tree's own file by AST (the function body, as the release ships it)
and run with triton directly: importing vllm.v1.worker.block_table pulls in the distributed and
warm-up stack and vLLM's triton_utils, which a CPU venv does not need for this one kernel.
The same function runs against the pristine tree, where it reads the neighbour's block (the bug)."""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

KERNEL_FILE = "vllm/v1/worker/block_table.py"
KV_BLOCK = 4        # tokens per KV block
STRIDE = 4          # blocks per request row (max_num_blocks_per_req)
ROWS = [[10, 11, 12, 13], [20, 21, 22, 23]]
QUERY_START = [0, 4, 6]
POSITIONS = [0, 1, 5, 17, 2, 6]   # 17 // 4 = block 4: past row 0 (4 blocks), i.e. row 1's first entry
MAX_TOKENS = 8
PAD = -1

_RUNNER = r'''
import importlib.util, inspect, json, sys
import torch
spec = importlib.util.spec_from_file_location("slot_kernel", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
k = mod.kernel
args = json.loads(sys.argv[2])
table = torch.tensor(args["rows"], dtype=torch.int32).reshape(-1)
qsl = torch.tensor(args["qsl"], dtype=torch.int32)
pos = torch.tensor(args["pos"], dtype=torch.int64)
out = torch.full((args["max_tokens"],), 777, dtype=torch.int64)
values = dict(
    num_tokens=len(args["pos"]), max_num_tokens=args["max_tokens"], query_start_loc_ptr=qsl,
    positions_ptr=pos, block_table_ptr=table, block_table_stride=args["stride"],
    block_size=args["kv_block"], slot_mapping_ptr=out, KV_CACHE_BLOCK_SIZE=args["kv_block"],
    BLOCKS_PER_KV_BLOCK=1, TOTAL_CP_WORLD_SIZE=1, TOTAL_CP_RANK=0, CP_KV_CACHE_INTERLEAVE_SIZE=1,
    PAD_ID=args["pad"], BLOCK_SIZE=16,
)
names = list(inspect.signature(k.fn).parameters)
missing = [n for n in names if n not in values]
if missing:
    raise SystemExit("kernel parameters this check does not know: %s" % missing)
k[(len(args["qsl"]),)](**{n: values[n] for n in names})
print(json.dumps(out.tolist()))
'''


def _kernel_module(tree: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """The tree's slot-mapping kernel as a module of its own (decorator and body as shipped)."""
    path = tree / KERNEL_FILE
    src = path.read_text()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ClassDef) and node.name == "ComputeSlotMappingKernel":
            fn = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "kernel"), None)
            break
    else:
        pytest.fail(f"{path}: no ComputeSlotMappingKernel class")
    assert fn is not None, f"{path}: ComputeSlotMappingKernel has no kernel()"
    lines = src.splitlines()
    jit = [d for d in fn.decorator_list if "triton.jit" in ast.unparse(d)]
    assert jit, f"{path}: kernel() is not @triton.jit"
    body = textwrap.dedent("\n".join(lines[jit[0].lineno - 1:fn.end_lineno]))
    dest.write_text("import triton\nimport triton.language as tl\n\n\n" + body + "\n")
    return dest


def _slots(tree: pathlib.Path, tmp_path: pathlib.Path) -> list[int]:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: the kernel cannot run (even interpreted)")
    mod = _kernel_module(tree, tmp_path / "slot_kernel.py")
    args = {"rows": ROWS, "qsl": QUERY_START, "pos": POSITIONS, "stride": STRIDE,
            "kv_block": KV_BLOCK, "max_tokens": MAX_TOKENS, "pad": PAD}
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _RUNNER, str(mod), json.dumps(args)],
                          capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0 and "backends" in proc.stderr and "triton" in proc.stderr:
        pytest.skip(f"triton's interpreter does not run here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _expected() -> list[int]:
    out = []
    for req in range(len(QUERY_START) - 1):
        for p in POSITIONS[QUERY_START[req]:QUERY_START[req + 1]]:
            block = p // KV_BLOCK
            out.append(ROWS[req][block] * KV_BLOCK + p % KV_BLOCK if block < STRIDE else PAD)
    return out + [PAD] * (MAX_TOKENS - len(POSITIONS))


def test_out_of_row_position_maps_to_pad(patched_tree: pathlib.Path, tmp_path: pathlib.Path) -> None:
    got = _slots(patched_tree, tmp_path)
    assert got == _expected(), got          # [40, 41, 45, -1, 82, 86, -1, -1]
    assert got[3] == PAD


def test_pristine_reads_the_next_row(pristine_tree: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """pristine_fails: the release's kernel maps the out-of-row token to row 1's block 20."""
    got = _slots(pristine_tree, tmp_path)
    assert got[3] == ROWS[1][0] * KV_BLOCK + POSITIONS[3] % KV_BLOCK, got   # 81, not PAD
    assert got[:3] + got[4:] == _expected()[:3] + _expected()[4:], got
