"""Runs inside a fresh interpreter with one vLLM source tree first on sys.path
(`python _tsm_probe.py TREE MODE`; checks call run()); reports one result (checklib.probe).

MODE `select`: CUDA backend selection for a sparse MLA layer (DeepSeek V3.2 /
GLM-5 shape: head_size 576) with the device capability stubbed, through the real
`CudaPlatform.get_attn_backend_cls` of the tree.

MODE `forward`: metadata builder -> impl.forward_mqa (per-request top-k ids ->
global slots -> shipped Triton kernel, TRITON_INTERPRET=1) against a dense fp32
reference on a tiny mixed decode+prefill batch.

MODES `select_v24` / `forward_v24`: the same for vLLM 0.24+ (upstream has its own
SM12x sparse backend): the selection table over capability x dtype x KV cache x
FlashInfer state, and the forward path through the release's own sparse
metadata builder and impl base.
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

    takes_num_heads = "num_heads" in inspect.signature(CudaPlatform.get_attn_backend_cls).parameters

    def select(cap, dtype, selected=None, env=None, kv="auto"):
        CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(*cap))
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
        res["sm90_flag"] = select((9, 0), bf16, selected=AttentionBackendEnum.TRITON_MLA_SPARSE)
        res["sm120_flag_flashmla"] = select((12, 0), bf16, selected=AttentionBackendEnum.FLASHMLA_SPARSE)
    return res


FI_CALL = (  # the keywords FLASHINFER_MLA_SPARSE_SM120 passes (0.24.0-0.33.0 alike)
    "query",
    "kv_cache",
    "workspace_buffer",
    "qk_nope_head_dim",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "block_tables",
    "seq_lens",
    "max_seq_len",
    "out",
    "bmm1_scale",
    "bmm2_scale",
    "sparse_mla_top_k",
)


def _install_flashinfer(state: str) -> None:
    """FlashInfer as each pinned release presents itself to vLLM 0.24+, on a CPU:
    `none` no sparse MLA decode API (has_flashinfer_sparse_mla_sm120() False);
    `old` the API but an MLA decode without kv_scale_format (0.6.12 / 0.6.13);
    `new` with kv_scale_format (0.6.14+). The real signatures are compared in
    tests/patches/test_tsm_flashinfer_signature.py against the wheels."""
    import types

    import vllm.utils.flashinfer as vfi

    for name in [m for m in sys.modules if m == "flashinfer" or m.startswith("flashinfer.")]:
        del sys.modules[name]
    if state == "none":
        vfi.has_flashinfer_sparse_mla_sm120 = lambda: False
        return
    params = ", ".join(f"{p}=None" for p in FI_CALL)
    if state == "new":
        params += ", kv_scale_format='pow2_fp32'"
    ns: dict = {}
    exec(f"def trtllm_batch_decode_with_kv_cache_mla({params}):\n    pass\n", ns)
    pkg = types.ModuleType("flashinfer")
    pkg.__path__ = []  # a package
    decode = types.ModuleType("flashinfer.decode")
    decode.trtllm_batch_decode_with_kv_cache_mla = ns["trtllm_batch_decode_with_kv_cache_mla"]
    sys.modules["flashinfer"], sys.modules["flashinfer.decode"] = pkg, decode
    vfi.has_flashinfer_sparse_mla_sm120 = lambda: True


def probe_select_v24() -> dict:
    """vLLM 0.24+: the selection table (capability x activations x KV cache x
    FlashInfer) through the real CudaPlatform.get_attn_backend_cls, and the KV
    cache dtype the MLA layer then uses (mla_attention's canonicalization)."""
    import types

    _stub_compiled_modules()
    import torch
    import vllm.config.vllm as vcfg
    import vllm.platforms as vplat
    from vllm.model_executor.layers.attention import mla_attention
    from vllm.model_executor.models import config as model_configs
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    try:
        from vllm.v1.attention.backends.mla import triton_mla_sparse as tsm
    except ImportError:
        tsm = None  # the pristine tree

    # (model_type, qk_nope_head_dim, qk_rope_head_dim, attention head_size): GLM-5's DSA
    # geometry, and GLM-5.3-Flash's rope-free one (glm5_next, vLLM 0.33+: head_size 512).
    geometry = {"glm_moe_dsa": ("glm_moe_dsa", 192, 64, 576), "glm5_next": ("glm5_next", 256, 0, 512)}

    def set_model(index_topk, model="glm_moe_dsa"):
        model_type, nope, rope, _ = geometry[model]
        hf = types.SimpleNamespace(
            index_topk=index_topk,
            model_type=model_type,
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope,
            kv_lora_rank=512,
            v_head_dim=256,
        )
        vcfg._current_vllm_config = types.SimpleNamespace(
            model_config=types.SimpleNamespace(hf_text_config=hf, hf_config=hf),
            parallel_config=types.SimpleNamespace(
                decode_context_parallel_size=1, prefill_context_parallel_size=1, tensor_parallel_size=1
            ),
        )

    def select(cap, dtype, kv, fi, selected=None, env=None, index_topk=2048, model="glm_moe_dsa"):
        CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(*cap))
        _install_flashinfer(fi)
        if tsm is not None:
            tsm.flashinfer_sm12x_sparse_decode_usable.cache_clear()
        set_model(index_topk, model)
        old = os.environ.pop("VLLM_TRITON_SPARSE_MLA", None)
        if env is not None:
            os.environ["VLLM_TRITON_SPARSE_MLA"] = env
        try:
            cfg = AttentionSelectorConfig(
                head_size=geometry[model][3], dtype=dtype, kv_cache_dtype=kv, block_size=64, use_mla=True, use_sparse=True
            )
            path = CudaPlatform.get_attn_backend_cls(selected, cfg, num_heads=16)
            backend = path.rsplit(".", 1)[-1]
            mod, _, name = path.rpartition(".")
            backend_cls = getattr(__import__(mod, fromlist=[name]), name)
            cache = mla_attention._canonicalize_sparse_mla_kv_cache_dtype(backend_cls, kv)
            return {"ok": True, "backend": backend, "path": path, "cache": cache}
        except Exception as e:  # noqa: BLE001 - reported to the check
            # the tree's own path (in ImportError texts) differs between patched and pristine
            error = f"{type(e).__name__}: {e}".replace(sys.argv[1].rstrip("/"), "<tree>")
            return {"ok": False, "error": error[:1500]}
        finally:
            os.environ.pop("VLLM_TRITON_SPARSE_MLA", None)
            if old is not None:
                os.environ["VLLM_TRITON_SPARSE_MLA"] = old

    def dsv32_cache(cap, kv):
        """The KV cache dtype DeepSeek V3.2's model config leaves for the layer."""
        CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(*cap))
        vplat._current_platform = CudaPlatform()
        try:  # 0.34.0+ also sets the indexer's logits dtype on it, through the real class
            from vllm.config.attention import AttentionConfig

            attention = AttentionConfig()
        except ImportError:
            attention = None
        cfg = types.SimpleNamespace(
            model_config=types.SimpleNamespace(hf_config=types.SimpleNamespace(index_topk=2048)),
            cache_config=types.SimpleNamespace(cache_dtype=kv),
            attention_config=attention,
        )
        model_configs.DeepseekV32ForCausalLM.verify_and_update_config(cfg)
        return cfg.cache_config.cache_dtype

    bf16, fp16 = torch.bfloat16, torch.float16
    # 9.x / 10.x first: vLLM caches what it learns about FlashInfer (functools.cache), so the
    # cases that must see the environment as it is run before any FlashInfer stand-in exists.
    early = {
        "env_sm90_bf16": select((9, 0), bf16, "auto", "none", env="1"),
        "env_sm100_fp16": select((10, 0), fp16, "auto", "none", env="1"),
        "env_off_sm90": select((9, 0), bf16, "auto", "none", env="0"),
    }
    if "TRITON_MLA_SPARSE" in AttentionBackendEnum.__members__:
        flag_sm90 = select((9, 0), bf16, "auto", "none", selected=AttentionBackendEnum.TRITON_MLA_SPARSE)
    table = {}
    for cap in ((9, 0), (10, 0), (12, 0), (12, 1)):
        # FlashInfer's state matters to the SM12x choice only (elsewhere the
        # stand-in would meet FlashInfer code that this patch does not touch).
        states = ("none", "old", "new") if cap[0] == 12 else ("none",)
        for dname, dtype in (("bf16", bf16), ("fp16", fp16)):
            for kv in ("auto", "bfloat16", "float16", "fp8", "fp8_ds_mla"):
                for fi in states:
                    key = f"{cap[0]}.{cap[1]}/{dname}/{kv}/{fi}"
                    table[key] = select(cap, dtype, kv, fi)
    # GLM-5.3-Flash (rope-free, head_size 512), where the release has the model (0.33+).
    glm5next = {}
    if (pathlib.Path(sys.argv[1]) / "vllm/models/glm5next").is_dir():
        for cap in ((9, 0), (10, 0), (12, 0), (12, 1)):
            states = ("none", "old", "new") if cap[0] == 12 else ("none",)
            for dname, dtype in (("bf16", bf16), ("fp16", fp16)):
                for kv in ("auto", "bfloat16", "float16", "fp8", "fp8_ds_mla"):
                    for fi in states:
                        glm5next[f"{cap[0]}.{cap[1]}/{dname}/{kv}/{fi}"] = select(cap, dtype, kv, fi, model="glm5_next")
        glm5next["env_sm90_bf16"] = select((9, 0), bf16, "auto", "none", env="1", model="glm5_next")
        glm5next["env_sm120_bf16_new"] = select((12, 0), bf16, "auto", "new", env="1", model="glm5_next")
        glm5next["topk1024_sm120_bf16_new"] = select((12, 0), bf16, "auto", "new", index_topk=1024, model="glm5_next")
    res = {
        "has_enum": "TRITON_MLA_SPARSE" in AttentionBackendEnum.__members__,
        "table": table,
        "glm5next": glm5next,
        "topk1024_sm120_bf16_new": select((12, 0), bf16, "auto", "new", index_topk=1024),
        **early,
        "env_sm120_bf16_new": select((12, 0), bf16, "auto", "new", env="1"),
        "env_off_sm120_bf16_new": select((12, 0), bf16, "auto", "new", env="0"),
        "dsv32_cache": {
            f"{c[0]}.{c[1]}/{kv}": dsv32_cache(c, kv) for c in ((12, 0), (9, 0), (10, 0)) for kv in ("bfloat16", "auto")
        },
    }
    if res["has_enum"]:
        res["flag_sm90"] = flag_sm90
        res["flag_sm120_fi_old"] = select((12, 0), bf16, "auto", "old", selected=AttentionBackendEnum.TRITON_MLA_SPARSE)
    res["flag_sm120_upstream_fp16"] = select(
        (12, 0), fp16, "auto", "new", selected=AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120
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
        builder = m.TritonMLASparseMetadataBuilder(_t.SimpleNamespace(block_size=BS), ["l0"], vllm_config, torch.device("cpu"))
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


def _ns(**kw):
    import types

    return types.SimpleNamespace(**kw)


def probe_forward_v24(rope: int = 64) -> dict:
    """vLLM 0.24+: the release's own sparse metadata builder (upstream's SM12x one, from 0.26 on
    the common sparse MLA builder) on a real CommonAttentionMetadata -> TritonMLASparseImpl (on
    the common sparse MLA impl base from 0.26) -> shipped kernel, against a dense fp32 reference;
    the KV cache blocks are not adjacent (block stride > block size, as when other layers' pages
    sit between them)."""
    _stub_compiled_modules()
    import torch
    import vllm.config.vllm as vcfg
    import vllm.utils.torch_utils as tu
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.mla import triton_mla_sparse as m

    # No accelerator here: no pinned host memory, no process group (TP world of one).
    tu.PIN_MEMORY = False
    try:  # 0.26+
        import vllm.model_executor.layers.attention.sparse_mla_attention as sma

        sma.get_tensor_model_parallel_world_size = lambda: 1
        if hasattr(sma, "PIN_MEMORY"):
            sma.PIN_MEMORY = False
    except ImportError:
        pass

    torch.manual_seed(0)
    results = {"common_impl": m._COMMON_IMPL, "builder_bases": [c.__name__ for c in m.TritonMLASparseMetadataBuilder.__mro__]}
    # rope 0: rope-free MLA (GLM-5.3-Flash, glm5_next: qk_nope_head_dim 256), D = kv_lora_rank.
    H, L, R, BS, TOPK = 4, 512, rope, 16, 32
    D = L + R
    nope = 128 if R else 256
    num_blocks, stride_rows = 12, BS + 8
    seq_lens, q_lens = [20, 9, 30], [1, 1, 5]  # two decodes, then a prefill
    T = sum(q_lens)
    hf = _ns(
        index_topk=TOPK,
        kv_lora_rank=L,
        qk_rope_head_dim=R,
        qk_nope_head_dim=nope,
        v_head_dim=128,
        model_type="glm_moe_dsa" if R else "glm5_next",
        num_attention_heads=H,
    )
    model_config = _ns(
        hf_config=hf,
        hf_text_config=hf,
        dtype=torch.bfloat16,
        max_model_len=4096,
        get_num_attention_heads=lambda parallel_config=None: H,
        model_arch_config=_ns(total_num_attention_heads=H),
        use_mla=True,
    )
    vllm_config = _ns(
        model_config=model_config,
        scheduler_config=_ns(max_num_batched_tokens=64, max_num_seqs=8),
        cache_config=_ns(block_size=BS, cache_dtype="auto"),
        parallel_config=_ns(
            prefill_context_parallel_size=1, decode_context_parallel_size=1, cp_kv_cache_interleave_size=1, tensor_parallel_size=1
        ),
        # cudagraph_mode and sparse_mla_shard_q: read by 0.34's sparse MLA impl (ShardQ), off here
        compilation_config=_ns(static_forward_context={"l0": _ns(prefill_backend=None)}, cudagraph_mode=None),
        attention_config=_ns(hisparse_config=None, sparse_mla_force_mqa=False, sparse_mla_shard_q=False),
        speculative_config=None,
    )
    vcfg._current_vllm_config = vllm_config
    for dtype in (torch.float16, torch.bfloat16):
        block_table = torch.tensor(torch.randperm(num_blocks).tolist(), dtype=torch.int32).view(3, 4)
        big = (torch.randn(num_blocks, stride_rows, D) * 0.5).to(dtype)
        kv_cache = big[:, :BS]  # stride(0) = stride_rows * D
        topk = torch.full((64, TOPK), -1, dtype=torch.int32)
        row = 0
        for r in range(3):
            for j in range(q_lens[r]):
                pos = seq_lens[r] - q_lens[r] + j
                n = min(pos + 1, TOPK - 3)
                topk[row, :n] = torch.randperm(pos + 1)[:n].to(torch.int32)
                topk[row] = topk[row][torch.randperm(TOPK)]
                row += 1
        qsl = torch.tensor([0, 1, 2, 7], dtype=torch.int32)
        sl = torch.tensor(seq_lens, dtype=torch.int32)
        cm = CommonAttentionMetadata(
            query_start_loc=qsl,
            query_start_loc_cpu=qsl,
            seq_lens=sl,
            num_reqs=3,
            num_actual_tokens=T,
            max_query_len=max(q_lens),
            max_seq_len=max(seq_lens),
            block_table_tensor=block_table,
            slot_mapping=torch.zeros(T, dtype=torch.int64),
            seq_lens_cpu_upper_bound=sl,
        )
        if hasattr(cm, "_token_to_req_indices_cache"):
            # 0.33+ builds the token -> request map with one of vLLM's own Triton kernels, which
            # vLLM disables without a GPU driver; the runner may hand it over precomputed.
            cm._token_to_req_indices_cache = torch.tensor([0, 1, 2, 2, 2, 2, 2], dtype=torch.int32)
        builder = m.TritonMLASparseMetadataBuilder(_ns(block_size=BS), ["l0"], vllm_config, torch.device("cpu"))
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
            qk_nope_head_dim=nope,
            qk_rope_head_dim=R,
            qk_head_dim=nope + R,
            v_head_dim=128,
            kv_b_proj=None,
            indexer=_ns(topk_indices_buffer=topk),
        )
        q = torch.randn(T, H, D).to(dtype)
        ql_nope = q[..., :L].transpose(0, 1).contiguous().transpose(0, 1)
        out, lse = impl.forward_mqa((ql_nope, q[..., L:]), kv_cache, md, layer=None)
        ref = torch.zeros(T, H, L)
        req_of_row = [r for r in range(3) for _ in range(q_lens[r])]
        for t in range(T):
            r = req_of_row[t]
            ids = [int(i) for i in topk[t].tolist() if i >= 0]
            k = torch.stack([kv_cache[int(block_table[r, i // BS]), i % BS].float() for i in ids])
            p_ = torch.softmax((q[t].float() @ k.T) * scale, dim=-1)
            ref[t] = p_ @ k[:, :L]
        results[str(dtype).split(".")[-1]] = {
            "shape": list(out.shape),
            "dtype": str(out.dtype),
            "max_abs_err": (out.float() - ref).abs().max().item(),
            "lse_is_none": lse is None,
            "metadata": type(md).__name__,
            "block_size": md.block_size,
            "req_id_per_token": md.req_id_per_token.tolist(),
        }
    # a skip-topk layer (no indexer) reads the shared buffer handed over in mla_args
    impl2 = m.TritonMLASparseImpl(
        num_heads=H,
        head_size=D,
        scale=1.0,
        num_kv_heads=1,
        alibi_slopes=None,
        sliding_window=None,
        kv_cache_dtype="auto",
        logits_soft_cap=None,
        attn_type="decoder",
        kv_sharing_target_layer_name=None,
        q_lora_rank=None,
        kv_lora_rank=L,
        qk_nope_head_dim=nope,
        qk_rope_head_dim=R,
        qk_head_dim=nope + R,
        v_head_dim=128,
        kv_b_proj=None,
        indexer=None,
        topk_indices_buffer=topk,
    )
    results["skip_topk_layer_buffer"] = impl2.topk_indices_buffer is topk
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
    if "missing_module" in res:
        import pytest

        pytest.skip(
            f"the smoke env lacks {res['missing_module']!r}, which this vLLM imports at "
            "module level (add it to patches/envs/vllm-cpu.txt)"
        )
    probe.assert_imported_from(res, "vllm_file", tree)
    return res


# vLLM 0.30+ imports its serving stack on the way to the attention layers (through
# vllm.model_executor.layers.attention); these checks never call into it, so where the smoke env
# lacks one of these packages an "anything" stand-in takes its place (nothing real is shadowed).
SERVING_STACK = ("uvloop", "prometheus_client", "xgrammar", "fastapi", "partial_json_parser", "llguidance")


def main() -> None:
    tree, mode = sys.argv[1], sys.argv[2]
    sys.path.insert(0, tree)
    from checklib import stubs

    stubs.stub_missing(*SERVING_STACK)
    try:
        res = {
            "select": probe_select,
            "select_v24": probe_select_v24,
            "forward": probe_forward,
            "forward_v24": probe_forward_v24,
            "forward_v24_rope_free": lambda: probe_forward_v24(rope=0),
        }[mode]()
    except ModuleNotFoundError as e:
        if not e.name or e.name.split(".")[0] == "vllm":
            raise
        # A package the release imports at module level that the smoke env lacks (vLLM 0.30+
        # pulls its serving stack in through vllm.model_executor.layers.attention).
        probe.emit({"missing_module": e.name})
        return
    import vllm

    res["vllm_file"] = vllm.__file__
    probe.emit(res)


if __name__ == "__main__":
    main()
