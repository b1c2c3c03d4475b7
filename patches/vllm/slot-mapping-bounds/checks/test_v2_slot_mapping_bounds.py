"""The model-runner-V2 slot-mapping Triton kernel (`_compute_slot_mappings_kernel` in
vllm/v1/worker/gpu/block_table.py) on a CPU, under TRITON_INTERPRET=1: a token whose block index
lies past its request's block-table row must map to PAD_ID, not read the next request's row.

The V2 kernel reaches each KV-cache group's block table through a pointer table (`_load_ptr` in
vllm/v1/worker/gpu/buffer_utils.py loads an address and casts it to an int32 pointer); both run
as _slot_probe.py's mode v2. Two groups with different block sizes make the test see that each
group's own table is read through that table."""

from __future__ import annotations

import pathlib

import pytest
from _slot_probe import V2_DIR, run

STRIDE = 4  # blocks per request row, both groups
TABLES = [  # [group][request row][block]
    [[10, 11, 12, 13], [20, 21, 22, 23]],
    [[30, 31, 32, 33], [40, 41, 42, 43]],
]
BLOCK_SIZES = [4, 8]  # tokens per KV block, per group
IDX_MAPPING = [0, 1]  # batch entry -> request row
QUERY_START = [0, 4, 6]
POSITIONS = [0, 1, 5, 17, 2, 6]  # group 0: 17 // 4 = block 4, past row 0 (row 1's first entry)
OUT_OF_ROW = 3  # the index of position 17; in group 1 it is block 2, in its row
MAX_TOKENS = 8
PAD = -1


def _slots(tree: pathlib.Path) -> list[list[int]]:
    if not (tree / V2_DIR / "block_table.py").is_file():
        pytest.skip(f"{tree}: no model-runner-V2 block table ({V2_DIR}/block_table.py)")
    args = {
        "tables": TABLES,
        "block_sizes": BLOCK_SIZES,
        "idx_mapping": IDX_MAPPING,
        "qsl": QUERY_START,
        "pos": POSITIONS,
        "max_tokens": MAX_TOKENS,
        "pad": PAD,
    }
    got: list[list[int]] = run(tree, "v2", args)
    return got


def _expected() -> list[list[int]]:
    out = []
    for table, size in zip(TABLES, BLOCK_SIZES, strict=True):
        row_slots = []
        for batch, row in enumerate(IDX_MAPPING):
            for p in POSITIONS[QUERY_START[batch] : QUERY_START[batch + 1]]:
                block = p // size
                row_slots.append(table[row][block] * size + p % size if block < STRIDE else PAD)
        out.append(row_slots + [PAD] * (MAX_TOKENS - len(POSITIONS)))
    return out


def test_v2_out_of_row_position_maps_to_pad(patched_tree: pathlib.Path) -> None:
    got = _slots(patched_tree)
    # [[40, 41, 45, -1, 82, 86, -1, -1], [240, 241, 245, 257, 322, 326, -1, -1]]
    assert got == _expected(), got
    assert got[0][OUT_OF_ROW] == PAD
    assert got[1][OUT_OF_ROW] == TABLES[1][0][2] * BLOCK_SIZES[1] + 1  # in its row: a real slot


def test_v2_pristine_reads_the_next_row(pristine_tree: pathlib.Path) -> None:
    """pristine_fails: the release's V2 kernel maps the out-of-row token to row 1's block 20."""
    got = _slots(pristine_tree)
    want = _expected()
    assert got[0][OUT_OF_ROW] == TABLES[0][1][0] * BLOCK_SIZES[0] + POSITIONS[OUT_OF_ROW] % BLOCK_SIZES[0], got  # 81
    want[0][OUT_OF_ROW] = got[0][OUT_OF_ROW]
    assert got == want, got
