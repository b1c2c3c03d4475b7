"""Runs in a fresh interpreter with one vLLM tree first on sys.path
(`python _dif_dispatch_probe.py TREE MODE`; checks call run()); reports one result
(checklib.probe).

Who computes the DSA indexer's logits, with the CUDA platform's device capability stubbed
(12.0 / 12.1 / 9.0 / 10.0) and VLLM_DSA_INDEXER_FALLBACK unset / 1 / 0, through the real
`vllm.utils.deep_gemm` wrappers and (where the tree has them) the real `sparse_attn_indexer`
decode path and `SparseAttnIndexer` constructor of the tree.

DeepGEMM is a CUDA binary that cannot run on a CPU. A stand-in `deep_gemm` package (written to
a temp dir, first on sys.path; vLLM prefers an installed `deep_gemm` to its vendored copy) does
what the real one does on the host before it launches anything: it answers on the GPUs it was
built for and otherwise throws the error DeepGEMM throws there (`DG_HOST_UNREACHABLE(
"Unsupported architecture")`, csrc/apis/attention.hpp of 891d57b4, the commit vLLM 0.24.0 pins,
which pybind11 raises as a RuntimeError). `pin` accepts arch 9 and 10 (891d57b4), `sm120`
accepts 9, 10 and 12 (as 0.25.0's pin a6b593d2 does). Its answers are marked (7.0), so a result
tells which side computed it.

MODE `dispatch`: the cases below with the stand-in installed.
MODE `absent`: no DeepGEMM at all (neither `deep_gemm` nor a vendored copy is installed).
"""

from __future__ import annotations

import inspect
import os
import pathlib
import sys
import tempfile

from checklib import probe, stubs

_STAND_IN = """
import torch

ARCH = 9  # the GPU's major arch, set by the probe per case
ACCEPTS = {9, 10}  # the arches this build has kernels for
CALLS = []
MARK = 7.0


def _dispatch(name, make):
    CALLS.append(name)
    if ARCH not in ACCEPTS:
        raise RuntimeError(
            "Assertion error (csrc/apis/attention.hpp:184): Unsupported architecture"
        )
    return make()


def _q(q):
    return q[0] if isinstance(q, tuple) else q


def fp8_fp4_mqa_logits(q, kv, weights, ks, ke, clean_logits=False, *a, **k):
    return _dispatch("mqa", lambda: torch.full(
        (_q(q).shape[0], kv[0].shape[0]), MARK))


fp8_mqa_logits = fp8_fp4_mqa_logits


def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, *a, **k):
    return _dispatch("metadata", lambda: torch.full(
        (num_sms + 1, 2), 7, dtype=torch.int32))


def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table,
                             schedule_meta, max_context_len, clean_logits=False, *a, **k):
    q = _q(q)
    return _dispatch("paged", lambda: torch.full(
        (q.shape[0] * q.shape[1], max_context_len), MARK))


fp8_paged_mqa_logits = fp8_fp4_paged_mqa_logits
"""


def _platform(cap):
    """Make vllm.platforms.current_platform the CUDA platform with capability `cap`; before any
    vLLM module binds `current_platform`."""
    stubs.install("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C", kind="empty")
    import vllm.platforms as platforms
    from vllm.platforms.cuda import CudaPlatform

    platform = CudaPlatform()
    platforms.current_platform = platform
    _set_cap(cap)
    return platform


def _set_cap(cap):
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(*cap))


def _reset_refusal():
    """Forget an earlier case's DeepGEMM refusal (the patched tree remembers it per process;
    the pristine tree has no such module)."""
    try:
        from vllm.v1.attention.ops import dsa_indexer_fallback as f
    except ImportError:
        return
    f._refused = None


def _env(value):
    os.environ.pop("VLLM_DSA_INDEXER_FALLBACK", None)
    if value is not None:
        os.environ["VLLM_DSA_INDEXER_FALLBACK"] = value


def _inputs():
    import torch

    torch.manual_seed(0)
    fp8 = torch.float8_e4m3fn
    M, N, H, D = 5, 23, 4, 32
    pre = dict(
        q=torch.randn(M, H, D).to(fp8),
        k=torch.randn(N, D).to(fp8),
        ks=torch.rand(N) + 0.5,
        w=torch.randn(M, H),
        lo=torch.tensor([0, 0, 3, 5, 10], dtype=torch.int32),
        hi=torch.tensor([1, 7, 12, 23, 23], dtype=torch.int32),
    )
    return pre


def _wrappers():
    import vllm.utils.deep_gemm as dg

    fp4_api = hasattr(dg, "fp8_fp4_mqa_logits")
    mqa = dg.fp8_fp4_mqa_logits if fp4_api else dg.fp8_mqa_logits
    paged = dg.fp8_fp4_paged_mqa_logits if fp4_api else dg.fp8_paged_mqa_logits
    wrap = (lambda x: (x, None)) if fp4_api else (lambda x: x)
    return dg, mqa, paged, wrap


def _call(fn):
    """'deep_gemm' (the stand-in's marked answer), ('fallback', result) or 'error: ...'."""
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - reported to the check
        return f"error: {type(e).__name__}: {e}"[:400], None
    if out.numel() and bool((out == 7).all()):
        return "deep_gemm", out
    return "fallback", out


def _wrapper_calls(pre) -> dict:
    """Prefill, decode metadata, decode, then prefill again: who answered each, and how far
    the fallback's prefill logits are from an independent per-row reference."""
    import torch
    from _dif_probe import _ref_prefill

    dg, mqa, paged, wrap = _wrappers()
    ref = torch.tensor(_ref_prefill(pre["q"], pre["k"], pre["ks"], pre["w"], pre["lo"], pre["hi"]), dtype=torch.float64)
    fin = torch.isfinite(ref)

    def prefill():
        return mqa(wrap(pre["q"]), (pre["k"], pre["ks"]), pre["w"], pre["lo"], pre["hi"], clean_logits=False)

    ctx = torch.tensor([[9], [16]], dtype=torch.int32)
    bs, nblocks, D, H = 16, 4, pre["q"].shape[2], pre["q"].shape[1]
    kv_cache = torch.zeros(nblocks, bs, 1, D + 4, dtype=torch.uint8)
    bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    qd = torch.randn(2, 1, H, D).to(torch.float8_e4m3fn)

    out: dict = {}
    out["prefill"], got = _call(prefill)
    if out["prefill"] == "fallback":
        out["prefill_inf_pattern_equal"] = bool(torch.equal(torch.isfinite(got), fin))
        out["prefill_max_abs_err"] = float((got.double()[fin] - ref[fin]).abs().max())
    out["metadata"], sched = _call(lambda: dg.get_paged_mqa_logits_metadata(ctx, bs, 8))
    if sched is None:
        sched = torch.zeros(9, 2, dtype=torch.int32)
    out["paged"], _ = _call(lambda: paged(wrap(qd), kv_cache, torch.randn(2, H), ctx, bt, sched, 32, clean_logits=False))
    out["prefill_again"], _ = _call(prefill)
    return out


CASES = {
    # name: (capability, arches the DeepGEMM build accepts, VLLM_DSA_INDEXER_FALLBACK)
    "sm120_pin": ((12, 0), {9, 10}, None),
    "sm121_pin": ((12, 1), {9, 10}, None),
    "sm120_sm120dg": ((12, 0), {9, 10, 12}, None),
    "sm120_pin_env0": ((12, 0), {9, 10}, "0"),
    "sm120_env1": ((12, 0), {9, 10, 12}, "1"),
    "sm90": ((9, 0), {9, 10}, None),
    "sm100": ((10, 0), {9, 10}, None),
    "sm90_env1": ((9, 0), {9, 10}, "1"),
    "sm100_refused": ((10, 0), set(), None),
}


def _indexer_decode(sai, deep_gemm, cap, accepts) -> dict:
    """The release's own sparse_attn_indexer decode step (3 requests, top-k 512) on CPU: the
    logits come from the wrappers (DeepGEMM stand-in or fallback), the top-k op it launches is
    recorded (CPU stand-ins registered as torch.ops._C.*) and the indices compared with the top-k
    of an independent reference."""
    import types

    import torch

    _set_cap(cap)
    deep_gemm.ARCH, deep_gemm.ACCEPTS = cap[0], accepts
    deep_gemm.CALLS.clear()
    _reset_refusal()
    torch.manual_seed(1)
    fp8 = torch.float8_e4m3fn
    B, H, D, bs, nblocks, max_model_len, topk = 3, 4, 32, 64, 64, 1280, 512
    lens = [700, 1100, 300]
    vals = torch.randn(nblocks, bs, D).to(fp8)
    scale = torch.rand(nblocks, bs) + 0.5
    raw = torch.empty(nblocks, bs * (D + 4), dtype=torch.uint8)
    raw[:, : bs * D] = vals.reshape(nblocks, -1).view(torch.uint8)
    raw[:, bs * D :] = scale.reshape(nblocks, -1).view(torch.uint8).reshape(nblocks, -1)
    kv_cache = raw.view(nblocks, bs, D + 4)  # the 3-D indexer cache allocation
    perm = torch.randperm(nblocks).to(torch.int32)
    block_table = perm[: B * 20].reshape(B, 20)
    q = torch.randn(B, H, D).to(fp8)
    weights = torch.randn(B, H)
    seq_lens = torch.tensor(lens, dtype=torch.int32)[:, None]

    decode = types.SimpleNamespace(
        decode_lens=torch.ones(B, dtype=torch.int32),
        requires_padding=False,
        seq_lens=seq_lens,
        block_table=block_table,
        schedule_metadata=torch.zeros(9, 2, dtype=torch.int32),
    )

    class Meta(types.SimpleNamespace):
        pass

    meta = Meta(
        slot_mapping=torch.zeros(B, dtype=torch.int64),
        num_decodes=B,
        num_prefills=0,
        num_decode_tokens=B,
        max_seq_len=max(lens),
        decode=decode,
        prefill=None,
    )
    sai.DeepseekV32IndexerMetadata = Meta  # the type the function asserts
    sai.get_forward_context = lambda: types.SimpleNamespace(attn_metadata={"layer.k": meta})

    class Workspace:
        def get_simultaneous(self, *specs):
            return [torch.zeros(*shape, dtype=dtype) for shape, dtype in specs]

    sai.current_workspace_manager = lambda: Workspace()
    launched.clear()
    buf = torch.full((B, topk), -2, dtype=torch.int32)
    res: dict = {}
    try:
        sai.sparse_attn_indexer(
            torch.zeros(B, 8),
            "layer.k",
            kv_cache,
            q,
            None,
            None,
            weights,
            128,
            "ue8m0",
            topk,
            D,
            max_model_len,
            sum(lens),
            buf,
            True,
        )
    except Exception as e:  # noqa: BLE001 - reported to the check
        res["error"] = f"{type(e).__name__}: {e}"[:600]
    res["topk_op"] = list(launched)
    res["deep_gemm_calls"] = list(deep_gemm.CALLS)
    deep_gemm.CALLS.clear()
    if "error" not in res and accepts and cap[0] not in accepts:
        # reference: explicit per-position scores, float64
        same = []
        for b in range(B):
            pos = torch.arange(lens[b])
            blk = block_table[b].long()[pos // bs]
            k = vals[blk, pos % bs].double()
            s = (q[b].double() @ k.T).clamp(min=0) * weights[b].double()[:, None]
            ref = s.sum(0) * scale[blk, pos % bs].double()
            want = set(torch.topk(ref, min(topk, lens[b])).indices.tolist())
            got = set(buf[b][buf[b] >= 0].tolist())
            same.append(got == want)
        res["topk_equals_reference"] = same
    return res


launched: list[str] = []


def _register_topk_ops():
    """CPU stand-ins for vLLM's CUDA top-k kernels (the tree's compiled ops are absent on a
    CPU): each records that it was launched and writes the top-k of every row's valid prefix."""
    import torch

    lib = torch.library.Library("_C", "FRAGMENT")

    def make(name):
        lib.define(
            f"{name}(Tensor logits, Tensor lengths, Tensor(a!) output, Tensor(b!) workspace, int k, int max_seq_len) -> ()"
        )

        def impl(logits, lengths, output, workspace, k, max_seq_len):
            launched.append(name)
            lens = lengths.reshape(logits.shape[0], -1)[:, -1]
            output.fill_(-1)
            for r in range(logits.shape[0]):
                n = min(k, int(lens[r]))
                output[r, :n] = torch.topk(logits[r, : int(lens[r])], n).indices.to(output.dtype)

        lib.impl(name, impl, "CPU")

    for name in ("cooperative_topk", "persistent_topk"):
        make(name)
    return lib


def probe_dispatch(stand_in_dir: pathlib.Path) -> dict:
    (stand_in_dir / "deep_gemm").mkdir()
    (stand_in_dir / "deep_gemm" / "__init__.py").write_text(_STAND_IN)
    sys.path.insert(0, str(stand_in_dir))
    _platform((12, 0))
    import deep_gemm
    from vllm.platforms import current_platform

    support = getattr(current_platform, "support_deep_gemm", None)
    res: dict = {"release_enables_deep_gemm_on_12x": bool(support and support())}
    pre = _inputs()
    cases = {}
    for name, (cap, accepts, env) in CASES.items():
        _set_cap(cap)
        deep_gemm.ARCH, deep_gemm.ACCEPTS = cap[0], accepts
        deep_gemm.CALLS.clear()
        _reset_refusal()
        _env(env)
        cases[name] = _wrapper_calls(pre)
        cases[name]["deep_gemm_calls"] = list(deep_gemm.CALLS)
    _env(None)
    res["cases"] = cases
    res["deep_gemm_file"] = deep_gemm.__file__

    try:
        import vllm.model_executor.layers.sparse_attn_indexer as sai
    except ImportError as e:
        res["indexer"] = f"no sparse_attn_indexer: {e}"
        return res
    res["has_cooperative_topk"] = "cooperative_topk" in inspect.getsource(sai.sparse_attn_indexer)
    if res["has_cooperative_topk"]:
        keep = _register_topk_ops()  # noqa: F841 - the ops live as long as the library
        res["indexer"] = {
            "sm120_pin": _indexer_decode(sai, deep_gemm, (12, 0), {9, 10}),
            "sm120_sm120dg": _indexer_decode(sai, deep_gemm, (12, 0), {9, 10, 12}),
            "sm90": _indexer_decode(sai, deep_gemm, (9, 0), {9, 10}),
            "sm100": _indexer_decode(sai, deep_gemm, (10, 0), {9, 10}),
        }
    return res


def probe_absent() -> dict:
    # No stand-in: the CPU smoke env installs no deep_gemm and a source tree vendors none (the
    # check asks the release's own has_deep_gemm() to be sure).
    _platform((12, 0))
    try:
        from vllm.utils.import_utils import has_deep_gemm
    except ImportError:
        from vllm.utils.deep_gemm import has_deep_gemm
    res: dict = {"has_deep_gemm": has_deep_gemm()}
    pre = _inputs()
    for name, cap in (("sm120", (12, 0)), ("sm90", (9, 0))):
        _set_cap(cap)
        res[name] = _wrapper_calls(pre)
    try:
        import vllm.model_executor.layers.sparse_attn_indexer as sai
    except ImportError as e:
        res["constructor"] = f"no sparse_attn_indexer: {e}"
        return res
    import torch
    from vllm.model_executor.custom_op import CustomOp

    # CustomOp.__init__ picks the forward from the compilation config (vllm.config imports
    # more than a CPU smoke env has); the DeepGEMM check after it is the release's own.
    CustomOp.__init__ = lambda self, *a, **k: torch.nn.Module.__init__(self)
    res["constructor_needs_deep_gemm"] = "has_deep_gemm()" in inspect.getsource(sai.SparseAttnIndexer.__init__)
    built = {}
    for name, cap in (("sm120", (12, 0)), ("sm90", (9, 0))):
        _set_cap(cap)
        params = inspect.signature(sai.SparseAttnIndexer.__init__).parameters
        kw = dict(
            k_cache=None,
            quant_block_size=128,
            scale_fmt="ue8m0",
            topk_tokens=512,
            head_dim=128,
            max_model_len=1024,
            max_total_seq_len=1024,
            topk_indices_buffer=torch.zeros(1, 512, dtype=torch.int32),
        )
        try:
            sai.SparseAttnIndexer(**{k: v for k, v in kw.items() if k in params})
            built[name] = "built"
        except Exception as e:  # noqa: BLE001 - reported to the check
            built[name] = f"{type(e).__name__}: {e}"[:400]
    res["constructor"] = built
    return res


def run(tree: pathlib.Path, mode: str) -> dict:
    """This probe in MODE against `tree` (checklib.probe), vLLM imported from the tree."""
    env = {
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT") or tempfile.mkdtemp(prefix="dif-vllm-cache-"),
        "VLLM_DSA_INDEXER_FALLBACK": None,
    }
    res = probe.run_probe(tree, __file__, mode, env=env)
    probe.assert_imported_from(res, "vllm_file", tree)
    return res


def main() -> None:
    tree, mode = sys.argv[1], sys.argv[2]
    sys.path.insert(0, tree)
    with tempfile.TemporaryDirectory(prefix="dif-dg-") as tmp:
        res = probe_dispatch(pathlib.Path(tmp)) if mode == "dispatch" else probe_absent()
    import vllm

    res["vllm_file"] = vllm.__file__
    probe.emit(res)


if __name__ == "__main__":
    main()
