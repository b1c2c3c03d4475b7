"""Runs inside a fresh interpreter with one vLLM source tree first on sys.path
(`python _tsm_probe.py TREE MODE`; checks call run()); reports one result (checklib.probe).

MODE `select`: CUDA backend selection for a sparse MLA layer (DeepSeek V3.2 /
GLM-5 shape: head_size 576) with the device capability stubbed, through the real
`CudaPlatform.get_attn_backend_cls` of the tree.

MODE `forward`: metadata builder -> impl.forward_mqa (per-request top-k ids ->
global slots -> shipped Triton kernel, TRITON_INTERPRET=1) against a dense fp32
reference on a tiny mixed decode+prefill batch.
"""
from __future__ import annotations

import inspect
import os
import pathlib
import sys
import tempfile

from checklib import probe, stubs


def _stub_compiled_modules() -> None:
    # vllm/platforms/cuda.py imports the compiled extensions at the top; a CPU
    # sdist tree has none. Selection logic needs none of their ops.
    stubs.install("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C", kind="empty")
    # cutlass_mla allocates a CUDA workspace at import time; on a CPU it is
    # reported as an ImportError (a dense backend: invalid for sparse anyway).
    stubs.install("vllm.v1.attention.backends.mla.cutlass_mla", kind="absent")


def probe_select() -> dict:
    _stub_compiled_modules()
    import torch
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    fields = AttentionSelectorConfig._fields

    def cfg(dtype, kv_cache_dtype="auto"):
        kw = dict(
            head_size=576,
            dtype=dtype,
            kv_cache_dtype=kv_cache_dtype,
            block_size=64,
            use_mla=True,
            use_sparse=True,
        )
        return AttentionSelectorConfig(**{k: v for k, v in kw.items() if k in fields})

    takes_num_heads = "num_heads" in inspect.signature(
        CudaPlatform.get_attn_backend_cls
    ).parameters

    def select(cap, dtype, selected=None, env=None, kv="auto"):
        CudaPlatform.get_device_capability = classmethod(
            lambda cls, device_id=0: DeviceCapability(*cap)
        )
        old = os.environ.pop("VLLM_TRITON_SPARSE_MLA", None)
        if env is not None:
            os.environ["VLLM_TRITON_SPARSE_MLA"] = env
        try:
            kw = {"num_heads": 64} if takes_num_heads else {}
            path = CudaPlatform.get_attn_backend_cls(selected, cfg(dtype, kv), **kw)
            return {"ok": True, "backend": path.rsplit(".", 1)[-1], "path": path}
        except Exception as e:  # noqa: BLE001 - reported to the check
            return {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
        finally:
            os.environ.pop("VLLM_TRITON_SPARSE_MLA", None)
            if old is not None:
                os.environ["VLLM_TRITON_SPARSE_MLA"] = old

    bf16, fp16 = torch.bfloat16, torch.float16
    res = {
        "has_enum": "TRITON_MLA_SPARSE" in AttentionBackendEnum.__members__,
        "sm120_bf16": select((12, 0), bf16),
        "sm120_fp16": select((12, 0), fp16),
        "sm121_bf16": select((12, 1), bf16),
        "sm120_fp8": select((12, 0), bf16, kv="fp8"),
        "sm90_bf16": select((9, 0), bf16),
        "sm100_bf16": select((10, 0), bf16),
        "sm100_fp8": select((10, 0), bf16, kv="fp8"),
        "sm90_env": select((9, 0), bf16, env="1"),
        "sm100_env_fp16": select((10, 0), fp16, env="1"),
        "sm90_env_off": select((9, 0), bf16, env="0"),
    }
    if res["has_enum"]:
        res["sm90_flag"] = select(
            (9, 0), bf16, selected=AttentionBackendEnum.TRITON_MLA_SPARSE
        )
        res["sm120_flag_flashmla"] = select(
            (12, 0), bf16, selected=AttentionBackendEnum.FLASHMLA_SPARSE
        )
    return res


def probe_forward() -> dict:
    import types as _t

    import torch
    from vllm.v1.attention.backends.mla import triton_mla_sparse as m

    torch.manual_seed(0)
    results = {}
    for dtype in (torch.float16, torch.bfloat16):
        H, L, R, BS, TOPK = 4, 512, 64, 16, 32
        D = L + R
        num_blocks = 12
        # two decode requests (1 token) then one prefill request (5 tokens)
        seq_lens = [20, 9, 30]
        q_lens = [1, 1, 5]
        T = sum(q_lens)
        block_table = torch.full((3, 4), 0, dtype=torch.int32)
        perm = torch.randperm(num_blocks).tolist()
        for r in range(3):
            for b in range(4):
                block_table[r, b] = perm[r * 4 + b]
        kv_cache = (torch.randn(num_blocks, BS, D) * 0.5).to(dtype)
        # per-request top-k token ids, -1 padded, causal (<= own position)
        topk = torch.full((64, TOPK), -1, dtype=torch.int32)  # buffer > T rows
        row = 0
        for r in range(3):
            for j in range(q_lens[r]):
                pos = seq_lens[r] - q_lens[r] + j
                n = min(pos + 1, TOPK - 3)  # always some -1 padding
                ids = torch.randperm(pos + 1)[:n]
                topk[row, :n] = ids.to(torch.int32)
                # scatter the -1s across the row, not only at the end
                topk[row] = topk[row][torch.randperm(TOPK)]
                row += 1
        qsl = [0]
        for n in q_lens:
            qsl.append(qsl[-1] + n)
        vllm_config = _t.SimpleNamespace(
            model_config=_t.SimpleNamespace(hf_config=_t.SimpleNamespace(index_topk=TOPK)),
            scheduler_config=_t.SimpleNamespace(max_num_batched_tokens=64),
            speculative_config=None,
            parallel_config=_t.SimpleNamespace(decode_context_parallel_size=1),
        )
        builder = m.TritonMLASparseMetadataBuilder(
            _t.SimpleNamespace(block_size=BS), ["l0"], vllm_config, torch.device("cpu")
        )
        cm = _t.SimpleNamespace(
            num_actual_tokens=T,
            query_start_loc_cpu=torch.tensor(qsl, dtype=torch.int32),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32),
            num_reqs=3,
            max_query_len=max(q_lens),
            max_seq_len=max(seq_lens),
            slot_mapping=torch.zeros(T, dtype=torch.int64),
            block_table_tensor=block_table,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        )
        md = builder.build(0, cm)
        scale = D**-0.5
        impl = m.TritonMLASparseImpl(
            num_heads=H,
            head_size=D,
            scale=scale,
            num_kv_heads=1,
            alibi_slopes=None,
            sliding_window=None,
            kv_cache_dtype="auto",
            logits_soft_cap=None,
            attn_type="decoder",
            kv_sharing_target_layer_name=None,
            q_lora_rank=None,
            kv_lora_rank=L,
            qk_nope_head_dim=128,
            qk_rope_head_dim=R,
            qk_head_dim=128 + R,
            v_head_dim=128,
            kv_b_proj=None,
            indexer=_t.SimpleNamespace(topk_indices_buffer=topk),
        )
        q = torch.randn(T, H, D).to(dtype)
        # the MLA layer hands over (ql_nope as a transposed view, q_pe)
        ql_nope = q[..., :L].transpose(0, 1).contiguous().transpose(0, 1)
        q_pe = q[..., L:]
        out, lse = impl.forward_mqa((ql_nope, q_pe), kv_cache, md, layer=None)
        # dense reference, computed independently
        ref = torch.zeros(T, H, L)
        req_of_row = [r for r in range(3) for _ in range(q_lens[r])]
        flat = kv_cache.float().reshape(-1, D)
        for t in range(T):
            r = req_of_row[t]
            ids = [int(i) for i in topk[t].tolist() if i >= 0]
            slots = [int(block_table[r, i // BS]) * BS + i % BS for i in ids]
            k = flat[slots]
            s = (q[t].float() @ k.T) * scale
            p = torch.softmax(s, dim=-1)
            ref[t] = p @ k[:, :L]
        err = (out.float() - ref).abs().max().item()
        results[str(dtype).split(".")[-1]] = {
            "shape": list(out.shape),
            "dtype": str(out.dtype),
            "max_abs_err": err,
            "lse_is_none": lse is None,
        }
    return results

def run(tree: pathlib.Path, mode: str, extra_env: dict | None = None) -> dict:
    """This probe in MODE against `tree` (checklib.probe), vLLM imported from the tree."""
    env = {
        "VLLM_TRITON_SPARSE_MLA": None,
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT") or tempfile.mkdtemp(prefix="tsm-vllm-cache-"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p),
        **(extra_env or {}),
    }
    res = probe.run_probe(tree, __file__, mode, env=env)
    probe.assert_imported_from(res, "vllm_file", tree)
    return res


def main() -> None:
    tree, mode = sys.argv[1], sys.argv[2]
    sys.path.insert(0, tree)
    res = probe_select() if mode == "select" else probe_forward()
    import vllm

    res["vllm_file"] = vllm.__file__
    probe.emit(res)


if __name__ == "__main__":
    main()
