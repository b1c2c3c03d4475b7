"""The model-runner-V2 slot-mapping Triton kernel (`_compute_slot_mappings_kernel` in
vllm/v1/worker/gpu/block_table.py) on a CPU, under TRITON_INTERPRET=1: a token whose block index
lies past its request's block-table row must map to PAD_ID, not read the next request's row.

The V2 kernel reaches each KV-cache group's block table through a pointer table (`_load_ptr` in
vllm/v1/worker/gpu/buffer_utils.py loads an address and casts it to an int32 pointer). Both
functions are taken from the tree's own files by AST (decorator and body as the release ships
them) and run with triton directly; the pointer table is an int64 tensor of the data_ptr()s of
CPU tensors, which the interpreter dereferences like any other pointer. Two groups with different
block sizes make the test see that each group's own table is read through that table."""
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

KERNEL_DIR = "vllm/v1/worker/gpu"
STRIDE = 4                       # blocks per request row, both groups
TABLES = [                       # [group][request row][block]
    [[10, 11, 12, 13], [20, 21, 22, 23]],
    [[30, 31, 32, 33], [40, 41, 42, 43]],
]
BLOCK_SIZES = [4, 8]             # tokens per KV block, per group
IDX_MAPPING = [0, 1]             # batch entry -> request row
QUERY_START = [0, 4, 6]
POSITIONS = [0, 1, 5, 17, 2, 6]  # group 0: 17 // 4 = block 4, past row 0 (row 1's first entry)
OUT_OF_ROW = 3                   # the index of position 17; in group 1 it is block 2, in its row
MAX_TOKENS = 8
PAD = -1

_RUNNER = r'''
import importlib.util, inspect, json, sys
import torch
spec = importlib.util.spec_from_file_location("v2_slot_kernel", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
k = mod._compute_slot_mappings_kernel
args = json.loads(sys.argv[2])
tables = [torch.tensor(t, dtype=torch.int32) for t in args["tables"]]
# The pointer table as vLLM builds it (BlockTables._make_ptr_tensor): one address per group.
ptrs = torch.tensor([t.data_ptr() for t in tables], dtype=torch.int64)
groups = len(tables)
sizes = torch.tensor(args["block_sizes"], dtype=torch.int32)
out = torch.full((groups, args["max_tokens"]), 777, dtype=torch.int64)
values = dict(
    max_num_tokens=args["max_tokens"],
    idx_mapping=torch.tensor(args["idx_mapping"], dtype=torch.int32),
    query_start_loc=torch.tensor(args["qsl"], dtype=torch.int32),
    pos=torch.tensor(args["pos"], dtype=torch.int64),
    block_table_ptrs=ptrs,
    block_table_strides=torch.tensor([t.stride(0) for t in tables], dtype=torch.int64),
    block_sizes=sizes, kernel_block_sizes=sizes,
    slot_mapping_enabled=torch.ones(groups, dtype=torch.bool),
    dcp_sharded=torch.zeros(groups, dtype=torch.bool),
    slot_mappings_ptr=out, slot_mappings_stride=out.stride(0), cp_rank=0,
    CP_SIZE=1, CP_INTERLEAVE=1, PAD_ID=args["pad"], TRITON_BLOCK_SIZE=16,
)
names = list(inspect.signature(k.fn).parameters)
missing = [n for n in names if n not in values]
if missing:
    raise SystemExit("kernel parameters this check does not know: %s" % missing)
k[(groups, len(args["qsl"]))](**{n: values[n] for n in names})
print(json.dumps(out.tolist()))
'''


def _jit_function(path: pathlib.Path, name: str) -> str:
    """The source of the module-level @triton.jit function `name` in `path`, decorator included."""
    src = path.read_text()
    fn = next((n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        pytest.fail(f"{path}: no function {name}")
    jit = [d for d in fn.decorator_list if "triton.jit" in ast.unparse(d)]
    assert jit, f"{path}: {name} is not @triton.jit"
    return textwrap.dedent("\n".join(src.splitlines()[jit[0].lineno - 1:fn.end_lineno]))


def _kernel_module(tree: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """The tree's V2 slot-mapping kernel and the pointer loader it calls, as one module."""
    gpu = tree / KERNEL_DIR
    if not (gpu / "block_table.py").is_file():
        pytest.skip(f"{tree}: no model-runner-V2 block table ({KERNEL_DIR}/block_table.py)")
    parts = [_jit_function(gpu / "buffer_utils.py", "_load_ptr"),
             _jit_function(gpu / "block_table.py", "_compute_slot_mappings_kernel")]
    dest.write_text("import triton\nimport triton.language as tl\n\n\n" + "\n\n\n".join(parts) + "\n")
    return dest


def _slots(tree: pathlib.Path, tmp_path: pathlib.Path) -> list[list[int]]:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: the kernel cannot run (even interpreted)")
    mod = _kernel_module(tree, tmp_path / "v2_slot_kernel.py")
    args = {"tables": TABLES, "block_sizes": BLOCK_SIZES, "idx_mapping": IDX_MAPPING,
            "qsl": QUERY_START, "pos": POSITIONS, "max_tokens": MAX_TOKENS, "pad": PAD}
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _RUNNER, str(mod), json.dumps(args)],
                          capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0 and "backends" in proc.stderr and "triton" in proc.stderr:
        pytest.skip(f"triton's interpreter does not run here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got: list[list[int]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return got


def _expected() -> list[list[int]]:
    out = []
    for table, size in zip(TABLES, BLOCK_SIZES, strict=True):
        row_slots = []
        for batch, row in enumerate(IDX_MAPPING):
            for p in POSITIONS[QUERY_START[batch]:QUERY_START[batch + 1]]:
                block = p // size
                row_slots.append(table[row][block] * size + p % size if block < STRIDE else PAD)
        out.append(row_slots + [PAD] * (MAX_TOKENS - len(POSITIONS)))
    return out


def test_v2_out_of_row_position_maps_to_pad(patched_tree: pathlib.Path, tmp_path: pathlib.Path) -> None:
    got = _slots(patched_tree, tmp_path)
    # [[40, 41, 45, -1, 82, 86, -1, -1], [240, 241, 245, 257, 322, 326, -1, -1]]
    assert got == _expected(), got
    assert got[0][OUT_OF_ROW] == PAD
    assert got[1][OUT_OF_ROW] == TABLES[1][0][2] * BLOCK_SIZES[1] + 1   # in its row: a real slot


def test_v2_pristine_reads_the_next_row(pristine_tree: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """pristine_fails: the release's V2 kernel maps the out-of-row token to row 1's block 20."""
    got = _slots(pristine_tree, tmp_path)
    want = _expected()
    assert got[0][OUT_OF_ROW] == TABLES[0][1][0] * BLOCK_SIZES[0] + POSITIONS[OUT_OF_ROW] % BLOCK_SIZES[0], got  # 81
    want[0][OUT_OF_ROW] = got[0][OUT_OF_ROW]
    assert got == want, got
