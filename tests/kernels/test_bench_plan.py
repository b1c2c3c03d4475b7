"""What bench_decode.py can be checked for without a GPU: its arguments, the bytes each cache
format moves (the floor the table divides by), the graph sizes (caches larger than L2), the
plain-torch peer's result, and that ``--plan`` runs end to end on a machine without CUDA."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[2] / "benchmarks" / "sparse_mla"
BENCH = HERE / "bench_decode.py"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"sparse_mla_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


plan_mod = _load("bench_plan")

# (kv, rope) -> bytes of one cache row at 2-byte activations, from the formats' definitions:
# bf16 two bytes a value; e4m3 one; fp8_ds_mla 512 e4m3 + 4 fp32 scales + the rope in bf16.
ROW = {("bf16", 64): 1152, ("bf16", 0): 1024, ("fp8", 64): 576, ("fp8", 0): 512, ("fp8_ds_mla", 64): 656, ("fp8_ds_mla", 0): 528}


@pytest.mark.parametrize("kv,rope", sorted(ROW))
def test_row_and_floor_bytes(kv, rope):
    assert plan_mod.cache_row_bytes(kv, rope) == ROW[(kv, rope)]
    for b, h in ((1, 8), (32, 16), (128, 8)):
        q_out = b * h * (512 + rope) * 2 + b * h * 512 * 2
        assert plan_mod.floor_bytes(b, h, 2048, kv, rope) == b * 2048 * ROW[(kv, rope)] + q_out


@pytest.mark.parametrize("l2_mib", [40, 60, 96, 128])
@pytest.mark.parametrize("kv", plan_mod.KV_FORMATS)
def test_every_default_point_reads_more_than_l2(kv, l2_mib):
    args = plan_mod.parse_args(["--kv", kv])
    l2 = int(l2_mib * 2**20)
    points = plan_mod.plan(args, l2)
    assert len(points) == 10  # 2 head counts x 5 batches
    for p in points:
        assert p["cache_bytes_per_replay"] == p["sets"] * p["B"] * 2048 * ROW[(kv, 64)]
        # 6x L2 where 256 calls reach it, else all 256 calls, still more than the L2
        assert p["cache_bytes_per_replay"] >= min(6 * l2, 256 * p["B"] * 2048 * ROW[(kv, 64)])
        assert p["cache_bytes_per_replay"] > l2, p


BAD_ARGS = {
    "kv_unknown": (["--kv", "fp4"], "--kv"),
    "kv_empty": (["--kv", ","], "--kv"),
    "batches_zero": (["--batches", "0,8"], "positive"),
    "batches_text": (["--batches", "eight"], "integers"),
    "heads_negative": (["--heads", "-8"], "integers"),
    "dtype_fp32": (["--dtypes", "fp32"], "--dtypes"),
    "repeat_zero": (["--repeat", "0"], "positive"),
    "rope_32": (["--rope", "32"], "--rope"),
    "limits_sm90": (["--limits", "sm90"], "--limits"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGS))
def test_bad_arguments_exit_2_naming_the_flag(case, capsys):
    argv, needle = BAD_ARGS[case]
    with pytest.raises(SystemExit) as e:
        plan_mod.parse_args(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,limits,kv,dtypes",
    [
        ([], "device", ["bf16"], ["bf16"]),
        (["--sm120-limits"], "sm120", ["bf16"], ["bf16"]),
        (["--limits", "sm120", "--kv", "fp8,fp8_ds_mla"], "sm120", ["fp8", "fp8_ds_mla"], ["bf16"]),
        (["--dtypes", "fp8"], "device", ["fp8"], ["bf16"]),  # the old spelling of an fp8 cache
        (["--dtypes", "fp16,fp8", "--kv", "bf16"], "device", ["bf16", "fp8"], ["fp16"]),
        (["--kv", "fp8_ds_mla", "--dtypes", "fp16,bf16"], "device", ["fp8_ds_mla"], ["fp16", "bf16"]),
    ],
)
def test_arguments(argv, limits, kv, dtypes):
    a = plan_mod.parse_args(argv)
    assert (a.limits, a.kv, a.act_dtypes) == (limits, kv, dtypes)


def test_plan_runs_without_a_gpu():
    """The script itself (imports, argument wiring, --plan) on this CPU-only machine."""
    p = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--plan",
            "--kv",
            "bf16,fp8,fp8_ds_mla",
            "--rope",
            "0",
            "--heads",
            "8",
            "--batches",
            "1,128",
            "--l2-mib",
            "128",
            "--sm120-limits",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    assert doc["limits"] == "sm120" and doc["l2_bytes"] == 128 * 2**20
    got = {(q["kv"], q["B"]): q["row_bytes"] for q in doc["points"]}
    assert got == {(kv, b): ROW[(kv, 0)] for kv in plan_mod.KV_FORMATS for b in (1, 128)}
    bad = subprocess.run([sys.executable, str(BENCH), "--plan", "--kv", "int4"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--kv" in bad.stderr and "Traceback" not in bad.stderr


# ---------------------------------------------------------------- the peer's maths (CPU)
torch = pytest.importorskip("torch", reason="the peer is torch code")


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="this torch has no float8_e4m3fn")
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("rope", [64, 0])
@pytest.mark.parametrize("kv", plan_mod.KV_FORMATS)
def test_peer_matches_float64_reference(kv, rope, seed):
    """The peer (gather, dequantise, two batched matmuls) against a float64 computation on
    the values the cache holds; fp8_ds_mla values read by the tests' own reader."""
    peer = _load("bench_peer")
    sys.path.insert(0, str(Path(__file__).parent))
    from ds_mla_cache import read_ds_mla

    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    B, H, topk, page, d = 3, 4, 40, 16, 512 + rope
    cache, kw = peer.make_cache(kv, 12, page, rope, torch.bfloat16, "cpu")
    flat = cache.reshape(-1, cache.shape[-1])
    vals = {
        "bf16": lambda: flat.double(),
        "fp8": lambda: flat.double() * kw["kv_scale"],
        "fp8_ds_mla": lambda: read_ds_mla(flat, rope, torch.bfloat16).double(),
    }[kv]()
    assert vals.shape[-1] == d
    idx = torch.randperm(flat.shape[0], generator=g)[: B * topk].view(B, topk).to(torch.int32)
    idx[1, 5:] = -1
    idx[2] = -1
    q = torch.randn(B, H, d, generator=g).to(torch.bfloat16)
    out = peer.peer_forward(q, cache, idx, 0.05, kv, rope, kw.get("kv_scale"))
    k = vals[idx.clamp_min(0).long()]
    s = torch.einsum("bhd,bkd->bhk", q.double(), k) * 0.05
    s = s.masked_fill((idx < 0)[:, None, :], float("-inf"))
    ref = torch.einsum("bhk,bkd->bhd", torch.softmax(s, -1).nan_to_num(0.0), k[..., :512])
    assert torch.all(out[2] == 0)
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    assert rel < 2e-2, rel  # bf16 operands and output (4 x 2**-8 is the kernel tests' bound)
