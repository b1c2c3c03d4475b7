"""The V1 worker's slot-mapping Triton kernel (`ComputeSlotMappingKernel.kernel` in
vllm/v1/worker/block_table.py) on a CPU, under TRITON_INTERPRET=1 (_slot_probe.py, mode v1): a
token whose block index lies past its request's block-table row must map to PAD_ID, not read the
next request's row. The same kernel runs against the pristine tree, where it reads the
neighbour's block (the bug)."""

from __future__ import annotations

import pathlib

import pytest
from _slot_probe import V1_FILE, run

KV_BLOCK = 4  # tokens per KV block
STRIDE = 4  # blocks per request row (max_num_blocks_per_req)
ROWS = [[10, 11, 12, 13], [20, 21, 22, 23]]
QUERY_START = [0, 4, 6]
POSITIONS = [0, 1, 5, 17, 2, 6]  # 17 // 4 = block 4: past row 0 (4 blocks), i.e. row 1's first entry
MAX_TOKENS = 8
PAD = -1


def _slots(tree: pathlib.Path) -> list[int]:
    if not (tree / V1_FILE).is_file():  # 0.34.0 removed the V1 model runner; the V2 check stays
        pytest.skip(f"{tree}: no V1 worker block table ({V1_FILE})")
    args = {
        "rows": ROWS,
        "qsl": QUERY_START,
        "pos": POSITIONS,
        "stride": STRIDE,
        "kv_block": KV_BLOCK,
        "max_tokens": MAX_TOKENS,
        "pad": PAD,
    }
    got: list[int] = run(tree, "v1", args)
    return got


def _expected() -> list[int]:
    out = []
    for req in range(len(QUERY_START) - 1):
        for p in POSITIONS[QUERY_START[req] : QUERY_START[req + 1]]:
            block = p // KV_BLOCK
            out.append(ROWS[req][block] * KV_BLOCK + p % KV_BLOCK if block < STRIDE else PAD)
    return out + [PAD] * (MAX_TOKENS - len(POSITIONS))


def test_out_of_row_position_maps_to_pad(patched_tree: pathlib.Path) -> None:
    got = _slots(patched_tree)
    assert got == _expected(), got  # [40, 41, 45, -1, 82, 86, -1, -1]
    assert got[3] == PAD


def test_pristine_reads_the_next_row(pristine_tree: pathlib.Path) -> None:
    """pristine_fails: the release's kernel maps the out-of-row token to row 1's block 20."""
    got = _slots(pristine_tree)
    assert got[3] == ROWS[1][0] * KV_BLOCK + POSITIONS[3] % KV_BLOCK, got  # 81, not PAD
    assert got[:3] + got[4:] == _expected()[:3] + _expected()[4:], got
