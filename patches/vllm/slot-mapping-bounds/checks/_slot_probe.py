"""Runs in a fresh interpreter under TRITON_INTERPRET=1 (`python _slot_probe.py TREE MODE ARGS`;
checks call run()); reports one result (checklib.probe): the slot mapping a release's own
@triton.jit slot-mapping kernel computes on a CPU for the batch ARGS (JSON) describes.

The kernels are taken from the tree's files by AST (decorator and body as the release ships them)
and run with triton directly: importing vllm.v1.worker.block_table pulls in the distributed and
warm-up stack and vLLM's triton_utils, which a CPU venv does not need for one kernel.

MODE `v1`: `ComputeSlotMappingKernel.kernel` of vllm/v1/worker/block_table.py.
MODE `v2`: `_compute_slot_mappings_kernel` of vllm/v1/worker/gpu/block_table.py with the pointer
loader it calls (`_load_ptr`, gpu/buffer_utils.py); each KV-cache group's block table is reached
through an int64 tensor of CPU tensors' data_ptr()s, which the interpreter dereferences.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import pathlib
import sys
import tempfile
import textwrap
import traceback
from typing import Any

from checklib import probe

V1_FILE = "vllm/v1/worker/block_table.py"
V2_DIR = "vllm/v1/worker/gpu"


def jit_source(path: pathlib.Path, name: str, owner: str | None = None) -> str:
    """The source of the @triton.jit function `name` in `path` (a method of class `owner`, or a
    module-level function), decorator included, dedented."""
    src = path.read_text()
    scope = ast.parse(src).body
    if owner is not None:
        cls = next((n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef) and n.name == owner), None)
        assert cls is not None, f"{path}: no {owner} class"
        scope = cls.body
    fn = next((n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name), None)
    assert fn is not None, f"{path}: no function {name}" + (f" in {owner}" if owner else "")
    jit = [d for d in fn.decorator_list if "triton.jit" in ast.unparse(d)]
    assert jit, f"{path}: {name} is not @triton.jit"
    return textwrap.dedent("\n".join(src.splitlines()[jit[0].lineno - 1 : fn.end_lineno]))


def _load(parts: list[str]) -> Any:
    dest = pathlib.Path(tempfile.mkdtemp(prefix="slot-kernel-")) / "slot_kernel.py"
    dest.write_text("import triton\nimport triton.language as tl\n\n\n" + "\n\n\n".join(parts) + "\n")
    spec = importlib.util.spec_from_file_location("slot_kernel", dest)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _call(k: Any, values: dict, grid: tuple) -> None:
    names = list(inspect.signature(k.fn).parameters)
    missing = [n for n in names if n not in values]
    if missing:
        raise SystemExit(f"kernel parameters this check does not know: {missing}")
    k[grid](**{n: values[n] for n in names})


def slots_v1(tree: pathlib.Path, args: dict) -> list:
    import torch

    k = _load([jit_source(tree / V1_FILE, "kernel", owner="ComputeSlotMappingKernel")]).kernel
    table = torch.tensor(args["rows"], dtype=torch.int32).reshape(-1)
    qsl = torch.tensor(args["qsl"], dtype=torch.int32)
    pos = torch.tensor(args["pos"], dtype=torch.int64)
    out = torch.full((args["max_tokens"],), 777, dtype=torch.int64)
    values = dict(
        num_tokens=len(args["pos"]),
        max_num_tokens=args["max_tokens"],
        query_start_loc_ptr=qsl,
        positions_ptr=pos,
        block_table_ptr=table,
        block_table_stride=args["stride"],
        block_size=args["kv_block"],
        slot_mapping_ptr=out,
        KV_CACHE_BLOCK_SIZE=args["kv_block"],
        BLOCKS_PER_KV_BLOCK=1,
        TOTAL_CP_WORLD_SIZE=1,
        TOTAL_CP_RANK=0,
        CP_KV_CACHE_INTERLEAVE_SIZE=1,
        PAD_ID=args["pad"],
        BLOCK_SIZE=16,
    )
    _call(k, values, (len(args["qsl"]),))
    return out.tolist()


def slots_v2(tree: pathlib.Path, args: dict) -> list:
    import torch

    gpu = tree / V2_DIR
    k = _load(
        [jit_source(gpu / "buffer_utils.py", "_load_ptr"), jit_source(gpu / "block_table.py", "_compute_slot_mappings_kernel")]
    )._compute_slot_mappings_kernel
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
        block_sizes=sizes,
        kernel_block_sizes=sizes,
        slot_mapping_enabled=torch.ones(groups, dtype=torch.bool),
        dcp_sharded=torch.zeros(groups, dtype=torch.bool),
        slot_mappings_ptr=out,
        slot_mappings_stride=out.stride(0),
        cp_rank=0,
        CP_SIZE=1,
        CP_INTERLEAVE=1,
        PAD_ID=args["pad"],
        TRITON_BLOCK_SIZE=16,
    )
    _call(k, values, (groups, len(args["qsl"])))
    return out.tolist()


def run(tree: pathlib.Path, mode: str, args: dict) -> list:
    """The slots the tree's MODE kernel computes for `args`, interpreted; skips where triton or
    its interpreter cannot run here."""
    import pytest

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: the kernel cannot run (even interpreted)")
    res = probe.run_probe(tree, __file__, mode, json.dumps(args), env={"TRITON_INTERPRET": "1"}, timeout=300)
    error = res.get("error", "")
    if "backends" in error and "triton" in error:
        pytest.skip(f"triton's interpreter does not run here: {error.strip().splitlines()[-1]}")
    assert not error, error[-3000:]
    return res["slots"]


def main() -> None:
    tree, mode, args = pathlib.Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    assert os.environ.get("TRITON_INTERPRET") == "1", "run me through run(): TRITON_INTERPRET=1"
    try:
        slots = {"v1": slots_v1, "v2": slots_v2}[mode](tree, args)
    except (AssertionError, SystemExit):
        raise  # the tree is not what this check reads, or the kernel's signature moved: fail
    except Exception:
        probe.emit({"error": traceback.format_exc()})
        return
    probe.emit({"slots": slots})


if __name__ == "__main__":
    main()
