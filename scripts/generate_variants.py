#!/usr/bin/env python3
"""Regenerate the variants of the patches whose patch.yaml says `generated_by: {generator:
scripts/generate_variants.py, ...}` from their sources and the real releases.

    python3 scripts/generate_variants.py [--check] [--only NAME] [--source PATH=FILE] [--kernel FILE]
        [--store DIR] [--pristine-root DIR] [--index-url URL] [--offline] [--release VERSION ...]

Today these are vllm/triton-sparse-mla (the Triton sparse MLA backend; its kernel,
kernels/sparse_mla/triton_sparse_mla.py, is the source of truth and is shipped verbatim) and its
companion vllm/dsa-indexer-fallback. Each has a recipe below: the upstream files it edits (edits
anchored on upstream text) and the files it ships, each made from one of the sources its
patch.yaml lists (paths relative to the folder that holds the store); a shipped file may come from
a different source per release family (ByTree: the recipe reads the pristine tree and picks one).

For every release a patch claims (its applies_to, among the releases on the package index;
ascending) the recipe is applied to that release's pristine files (patchctl's cached pristine tree,
patchctl.sources.fetch + patchctl.smoke.trees) in a scratch git repository, committed and exported
with patchctl.core.gitutil (fixed identity and dates: same trees + same sources -> same bytes). A new
variant file is made only where the newest variant so far does not give the release exactly the
files the recipe gives it; the store keeps as few variants as the code history needs. Variant files
of the patch that the generator no longer makes are removed. Prints the variant chosen for every
release and the sha256 of every variant file; review the diff, then `patchctl pin`.

--check writes nothing and exits 1, naming each variant file that differs from what the sources
give (or is missing, or is no longer made), or whose series.yaml pin is not its sha256.
--source PATH=FILE generates as if the source PATH (as listed in patch.yaml) held FILE's bytes;
--kernel FILE is --source kernels/sparse_mla/triton_sparse_mla.py=FILE.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from a checkout: the patchctl beside it
    sys.path.insert(0, str(REPO))

from packaging.version import Version  # noqa: E402

from patchctl.core import gitutil  # noqa: E402
from patchctl.core.engines import get_engine  # noqa: E402
from patchctl.store.layered import Store  # noqa: E402
from patchctl.store.series import Patch  # noqa: E402

GENERATOR = "scripts/generate_variants.py"  # what patch.yaml's generated_by.generator names
KERNEL = "kernels/sparse_mla/triton_sparse_mla.py"


class EditError(RuntimeError):
    pass


def insert_after(text: str, anchor: str, addition: str, *, path: str) -> str:
    if text.count(anchor) != 1:
        raise EditError(f"{path}: anchor found {text.count(anchor)} times:\n{anchor}")
    i = text.index(anchor) + len(anchor)
    return text[:i] + addition + text[i:]


def replace_once(text: str, old: str, new: str, *, path: str) -> str:
    if text.count(old) != 1:
        raise EditError(f"{path}: text found {text.count(old)} times:\n{old}")
    return text.replace(old, new)


class ByTree(NamedTuple):
    """A shipped file whose source depends on the release family: `choose` reads the pristine tree
    and names one of `sources` (each as patch.yaml lists it)."""

    choose: Callable[[Path], str]
    sources: tuple[str, ...]


class Recipe(NamedTuple):
    files: Callable[[Path], list[str]]  # pristine tree -> the upstream files edited
    edit: Callable[[str, str], str]  # (path, pristine text) -> edited text
    # file added to the release -> the source (as patch.yaml lists it) it is, or ByTree
    ships: dict[str, str | ByTree]


def recipe_sources(recipe: Recipe) -> set[str]:
    """Every source the recipe may ship."""
    return {s for src in recipe.ships.values() for s in (src.sources if isinstance(src, ByTree) else (src,))}


def shipped_for(recipe: Recipe, tree: Path, data: dict[str, bytes]) -> dict[str, bytes]:
    """The files the recipe adds to this release (`data`: every source's bytes)."""
    out = {}
    for rel, src in recipe.ships.items():
        name = src.choose(tree) if isinstance(src, ByTree) else src
        if isinstance(src, ByTree) and name not in src.sources:
            raise EditError(f"{rel}: the recipe chose {name}, not one of {src.sources}")
        out[rel] = data[name]
    return out


# --------------------------------------------------------------------------
# triton-sparse-mla
# --------------------------------------------------------------------------
TSM_REGISTRY_ANCHOR = """    FLASHMLA_SPARSE = (
        "vllm.v1.attention.backends.mla.flashmla_sparse.FlashMLASparseBackend"
    )
"""
TSM_REGISTRY_ADD = """    # Downstream (patchctl triton-sparse-mla): sparse MLA through Triton,
    # the sparse backend for compute capability 12.x before vLLM 0.24.
    TRITON_MLA_SPARSE = (
        "vllm.v1.attention.backends.mla.triton_mla_sparse.TritonMLASparseBackend"
    )
"""
TSM_CUDA_ANCHOR = """        device_capability = cls.get_device_capability()
        assert device_capability is not None
"""
TSM_CUDA_ADD = """
        # Downstream (patchctl triton-sparse-mla): sparse MLA models get the
        # Triton sparse backend on 12.x (no upstream one accepts it) or when
        # forced with VLLM_TRITON_SPARSE_MLA=1; an explicit choice wins.
        from vllm.v1.attention.backends.mla.triton_mla_sparse import (
            maybe_select_triton_sparse_mla,
        )

        selected_backend = maybe_select_triton_sparse_mla(
            selected_backend, device_capability, attn_selector_config
        )
"""
TSM_ENVS_DECL_ANCHOR = "    VLLM_USE_TRITON_AWQ: bool = False\n"
TSM_ENVS_DECL_ADD = "    VLLM_TRITON_SPARSE_MLA: bool = False\n"
TSM_ENVS_DICT_ANCHOR = '    "VLLM_USE_TRITON_AWQ": lambda: bool(int(os.getenv("VLLM_USE_TRITON_AWQ", "0"))),\n'
TSM_ENVS_DICT_ADD = """    # If set, sparse MLA models (DeepSeek V3.2, GLM-5) use the Triton sparse MLA
    # backend on any CUDA GPU (it is automatic on compute capability 12.x).
    "VLLM_TRITON_SPARSE_MLA": lambda: bool(
        int(os.getenv("VLLM_TRITON_SPARSE_MLA", "0"))
    ),
"""


# vLLM 0.24+ has an SM12x sparse backend of its own (FLASHINFER_MLA_SPARSE_SM120): there the
# Triton backend becomes the fallback for what that one cannot run, and ships the >=0.24 source.
TSM_SM12X_UPSTREAM = "FLASHINFER_MLA_SPARSE_SM120"
TSM_SOURCE = "patches/vllm/triton-sparse-mla/src/triton_mla_sparse.py"
TSM_SOURCE_V24 = "patches/vllm/triton-sparse-mla/src/triton_mla_sparse_v24.py"
TSM_REGISTRY_ADD_V24 = """    # Downstream (patchctl triton-sparse-mla): sparse MLA through Triton, the
    # fallback for what FLASHINFER_MLA_SPARSE_SM120 cannot run on 12.x.
    TRITON_MLA_SPARSE = (
        "vllm.v1.attention.backends.mla.triton_mla_sparse.TritonMLASparseBackend"
    )
"""
TSM_CUDA_ADD_V24 = """
        # Downstream (patchctl triton-sparse-mla): a sparse MLA layer gets the
        # Triton sparse backend when forced with VLLM_TRITON_SPARSE_MLA=1, or on
        # 12.x where upstream's candidates give no backend that runs (none
        # valid, or a FlashInfer without the SM12x sparse decode). An explicit
        # --attention-backend and every working upstream choice win.
        if attn_selector_config.use_mla and attn_selector_config.use_sparse:
            from vllm.v1.attention.backends.mla.triton_mla_sparse import (
                maybe_select_triton_sparse_mla,
            )

            selected_backend = maybe_select_triton_sparse_mla(
                cls,
                selected_backend,
                device_capability,
                attn_selector_config,
                num_heads,
            )
"""
# DeepSeek V3.2's model config turns an explicit bfloat16 cache into "auto", which on 12.x the
# attention layer rewrites to fp8_ds_mla for FLASHINFER_MLA_SPARSE_SM120: keep it bf16 there.
TSM_DSV32_BF16_OLD = """        if cache_config.cache_dtype == "bfloat16":
            cache_config.cache_dtype = "auto"
            logger.info("Using bfloat16 kv-cache for DeepSeekV3.2")
"""
TSM_DSV32_BF16_NEW = """        if cache_config.cache_dtype == "bfloat16" and not _keep_bf16_kv_cache_sm12x():
            cache_config.cache_dtype = "auto"
            logger.info("Using bfloat16 kv-cache for DeepSeekV3.2")
"""
TSM_MODELS_CONFIG_ANCHOR = "logger = init_logger(__name__)\n"
TSM_MODELS_CONFIG_ADD = """

def _keep_bf16_kv_cache_sm12x() -> bool:
    # Downstream (patchctl triton-sparse-mla): on 12.x "auto" becomes
    # FLASHINFER_MLA_SPARSE_SM120's fp8_ds_mla; an explicit bfloat16 cache
    # stays bfloat16 there (served by TRITON_MLA_SPARSE).
    from vllm.platforms import current_platform

    return current_platform.is_cuda() and (
        current_platform.is_device_capability_family(120)
    )
"""
TSM_MODELS_CONFIG = "vllm/model_executor/models/config.py"


def tsm_has_sm12x_backend(tree: Path) -> bool:
    """Whether the release has upstream's SM12x sparse MLA backend (vLLM 0.24+)."""
    return (tree / "vllm/v1/attention/backends/mla/flashinfer_mla_sparse_sm120.py").is_file()


def tsm_files(tree: Path) -> list[str]:
    files = ["vllm/v1/attention/backends/registry.py", "vllm/platforms/cuda.py", "vllm/envs.py"]
    if tsm_has_sm12x_backend(tree):
        files.append(TSM_MODELS_CONFIG)
    return files


def tsm_source(tree: Path) -> str:
    return TSM_SOURCE_V24 if tsm_has_sm12x_backend(tree) else TSM_SOURCE


def tsm_edit(path: str, text: str) -> str:
    # The release family is read off the file itself: 0.24+ names its SM12x backend there.
    v24 = TSM_SM12X_UPSTREAM in text
    if path == "vllm/v1/attention/backends/registry.py":
        return insert_after(text, TSM_REGISTRY_ANCHOR, TSM_REGISTRY_ADD_V24 if v24 else TSM_REGISTRY_ADD, path=path)
    if path == "vllm/platforms/cuda.py":
        return insert_after(text, TSM_CUDA_ANCHOR, TSM_CUDA_ADD_V24 if v24 else TSM_CUDA_ADD, path=path)
    if path == "vllm/envs.py":
        text = insert_after(text, TSM_ENVS_DECL_ANCHOR, TSM_ENVS_DECL_ADD, path=path)
        return insert_after(text, TSM_ENVS_DICT_ANCHOR, TSM_ENVS_DICT_ADD, path=path)
    if path == TSM_MODELS_CONFIG:
        text = replace_once(text, TSM_DSV32_BF16_OLD, TSM_DSV32_BF16_NEW, path=path)
        return insert_after(text, TSM_MODELS_CONFIG_ANCHOR, TSM_MODELS_CONFIG_ADD, path=path)
    raise KeyError(path)


# --------------------------------------------------------------------------
# dsa-indexer-fallback (companion patch)
# --------------------------------------------------------------------------
DIF_ENVS_DECL_ANCHOR = "    VLLM_USE_DEEP_GEMM: bool = True\n"
DIF_ENVS_DECL_ADD = "    VLLM_DSA_INDEXER_FALLBACK: bool = False\n"
DIF_ENVS_DICT_ANCHOR = '    "VLLM_USE_DEEP_GEMM": lambda: bool(int(os.getenv("VLLM_USE_DEEP_GEMM", "1"))),\n'
DIF_ENVS_DICT_ADD = """    # If set, the DSA indexer computes its fp8 MQA logits with the portable
    # PyTorch fallback instead of DeepGEMM (automatic where DeepGEMM does not
    # support the GPU, e.g. compute capability 12.x).
    "VLLM_DSA_INDEXER_FALLBACK": lambda: bool(
        int(os.getenv("VLLM_DSA_INDEXER_FALLBACK", "0"))
    ),
"""
DIF_DG_IMPORT = """
def _dsa_indexer_fallback() -> bool:
    # Downstream (patchctl dsa-indexer-fallback).
    from vllm.v1.attention.ops.dsa_indexer_fallback import use_indexer_fallback

    return use_indexer_fallback()

"""
DIF_DG_REFUSAL = """

# Downstream (patchctl dsa-indexer-fallback): where this release runs DeepGEMM
# on a GPU that the installed DeepGEMM refuses (vLLM 0.24's pin on 12.x), the
# first refusal switches the indexer to the fallback (see on_refusal).
from vllm.v1.attention.ops.dsa_indexer_fallback import (  # noqa: E402
    on_refusal as _dsa_on_refusal,
)

{assignments}"""
# 0.24.x launches its cooperative top-k (clustered, >99 KB of shared memory)
# on 12.x too; 0.25.0 leaves 12.x to the persistent top-k.
DIF_COOP_TOPK_OLD = """            and current_platform.has_device_capability(90)
        )
        use_persistent_topk = """
DIF_COOP_TOPK_NEW = """            and current_platform.has_device_capability(90)
            # Downstream (patchctl dsa-indexer-fallback): not on 12.x, whose
            # shared memory cannot hold the cooperative kernels' buffers.
            and not current_platform.is_device_capability_family(120)
        )
        use_persistent_topk = """


def _params(text: str, func: str) -> list[str]:
    start = text.index(f"\ndef {func}(") + len(f"\ndef {func}(")
    sig = text[start : text.index(") ->", start)]
    while re.search(r"\[[^\[\]]*\]", sig):  # drop subscripts: tuple[a, b]
        sig = re.sub(r"\[[^\[\]]*\]", "", sig)
    parts = [p.strip() for p in sig.split(",")]
    return [p.split(":")[0].split("=")[0].strip() for p in parts if p and p != "*"]


def _dg_hook(text: str, func: str, body: str, path: str) -> str:
    """Insert `body` as the first statements of deep_gemm.<func> (after the
    docstring, before `_lazy_init()`)."""
    start = text.index(f"\ndef {func}(")
    anchor = "    _lazy_init()\n"
    j = text.index(anchor, start)
    nxt = text.find("\ndef ", start + 5)
    if nxt != -1 and j > nxt:
        raise EditError(f"{path}: {func} has no _lazy_init() call")
    return text[:j] + body + text[j:]


def dif_edit(path: str, text: str) -> str:
    if path == "vllm/envs.py":
        text = insert_after(text, DIF_ENVS_DECL_ANCHOR, DIF_ENVS_DECL_ADD, path=path)
        return insert_after(text, DIF_ENVS_DICT_ANCHOR, DIF_ENVS_DICT_ADD, path=path)
    if path == "vllm/utils/deep_gemm.py":
        fp4 = "\ndef fp8_fp4_mqa_logits(" in text
        mqa = "fp8_fp4_mqa_logits" if fp4 else "fp8_mqa_logits"
        paged = "fp8_fp4_paged_mqa_logits" if fp4 else "fp8_paged_mqa_logits"
        pm, pmeta, pp = (_params(text, f) for f in (mqa, "get_paged_mqa_logits_metadata", paged))
        if len(pm) != 6 or len(pmeta) != 3 or len(pp) != 8:
            raise EditError(f"{path}: unexpected signatures {pm} {pmeta} {pp}")
        # helper right before the first wrapper
        i = text.index(f"\ndef {mqa}(")
        text = text[:i] + "\n" + DIF_DG_IMPORT.strip("\n") + "\n\n" + text[i:]
        text = _dg_hook(
            text,
            mqa,
            "    if _dsa_indexer_fallback():\n"
            "        from vllm.v1.attention.ops.dsa_indexer_fallback import (\n"
            "            fp8_mqa_logits_fallback,\n"
            "        )\n\n"
            "        return fp8_mqa_logits_fallback(\n"
            f"            {', '.join(pm[:5])}\n"
            "        )\n",
            path,
        )
        text = _dg_hook(
            text,
            "get_paged_mqa_logits_metadata",
            "    if _dsa_indexer_fallback():\n"
            "        # The fallback needs no schedule; keep the buffer's shape.\n"
            "        return torch.zeros(\n"
            f"            ({pmeta[2]} + 1, 2), dtype=torch.int32, "
            f"device={pmeta[0]}.device\n"
            "        )\n",
            path,
        )
        text = _dg_hook(
            text,
            paged,
            "    if _dsa_indexer_fallback():\n"
            "        from vllm.v1.attention.ops.dsa_indexer_fallback import (\n"
            "            fp8_paged_mqa_logits_fallback,\n"
            "        )\n\n"
            "        return fp8_paged_mqa_logits_fallback(\n"
            f"            {', '.join(pp[:5])}, {pp[6]}\n"
            "        )\n",
            path,
        )
        names = (mqa, "get_paged_mqa_logits_metadata", paged)
        assignments = "".join(f"{n} = _dsa_on_refusal({n})\n" for n in names)
        return text.rstrip("\n") + "\n" + DIF_DG_REFUSAL.format(assignments=assignments)
    if path == "vllm/model_executor/layers/sparse_attn_indexer.py":
        if DIF_COOP_TOPK_OLD in text:
            text = replace_once(text, DIF_COOP_TOPK_OLD, DIF_COOP_TOPK_NEW, path=path)
        old = "        if current_platform.is_cuda() and not has_deep_gemm():\n"
        new = (
            "        if (\n"
            "            current_platform.is_cuda()\n"
            "            and not has_deep_gemm()\n"
            "            # Downstream (patchctl dsa-indexer-fallback): the PyTorch\n"
            "            # fallback needs no DeepGEMM.\n"
            "            and not _dsa_indexer_fallback()\n"
            "        ):\n"
        )
        text = replace_once(text, old, new, path=path)
        anchor = "logger = init_logger(__name__)\n"
        add = (
            "\n\ndef _dsa_indexer_fallback() -> bool:\n"
            "    from vllm.v1.attention.ops.dsa_indexer_fallback import (\n"
            "        use_indexer_fallback,\n"
            "    )\n\n"
            "    return use_indexer_fallback()\n\n"
        )
        return insert_after(text, anchor, add, path=path)
    raise KeyError(path)


def dif_files(pristine: Path) -> list[str]:
    files = ["vllm/envs.py", "vllm/utils/deep_gemm.py"]
    sai = pristine / "vllm/model_executor/layers/sparse_attn_indexer.py"
    if sai.is_file() and "not has_deep_gemm():" in sai.read_text():
        files.append("vllm/model_executor/layers/sparse_attn_indexer.py")
    return files


RECIPES: dict[tuple[str, str], Recipe] = {
    ("vllm", "triton-sparse-mla"): Recipe(
        files=tsm_files,
        edit=tsm_edit,
        ships={
            "vllm/v1/attention/backends/mla/triton_mla_sparse.py": ByTree(tsm_source, (TSM_SOURCE, TSM_SOURCE_V24)),
            "vllm/v1/attention/ops/triton_sparse_mla.py": KERNEL,
        },
    ),
    # which releases: applies_to in its patch.yaml (0.17.x/0.18.x already fall back to PyTorch
    # logits when DeepGEMM is not supported on the GPU)
    ("vllm", "dsa-indexer-fallback"): Recipe(
        files=dif_files,
        edit=dif_edit,
        ships={"vllm/v1/attention/ops/dsa_indexer_fallback.py": "patches/vllm/dsa-indexer-fallback/src/dsa_indexer_fallback.py"},
    ),
}


# --------------------------------------------------------------------------
# the generator
# --------------------------------------------------------------------------
class Generated(NamedTuple):
    patch: Patch
    chosen: dict[str, str]  # release -> variant file it gets
    variants: dict[str, bytes]  # variant file -> bytes


def generated_patches(store: Store) -> list[Patch]:
    """Every patch of the store whose patch.yaml declares this script as its generator."""
    found = []
    for engine in store.engines():
        for patch in store.series(engine).patches:
            if patch.generated_by and patch.generated_by["generator"] == GENERATOR:
                found.append(patch)
    return found


def recipe_for(patch: Patch) -> Recipe:
    recipe = RECIPES.get((patch.engine, patch.name))
    if recipe is None:
        raise SystemExit(
            f"{patch.engine}/{patch.name}: patch.yaml names {GENERATOR} as its generator, which has no recipe for it"
        )
    declared, used = set(patch.generated_by["sources"]), recipe_sources(recipe)
    if declared != used:
        raise SystemExit(
            f"{patch.engine}/{patch.name}: generated_by.sources {sorted(declared)} in patch.yaml, the recipe reads {sorted(used)}"
        )
    return recipe


def release_versions(patch: Patch, ctx, pristine_root: Path | None, releases: list[Version] | None = None) -> list[Version]:
    """The releases the patch claims (its applies_to), ascending: from the package index, or the
    trees present under --pristine-root, or `releases` (--release; the tests pass the committed
    matrix's rows, so a new upstream release does not change what they generate)."""
    dist = get_engine(patch.engine).dist
    if releases is not None:
        candidates = list(releases)
    elif pristine_root:
        names = (re.fullmatch(rf"{re.escape(dist)}-(\d[^-]*)-sdist", d.name) for d in pristine_root.iterdir())
        candidates = [Version(m.group(1)) for m in names if m]
    else:
        candidates = ctx.index_for().project(dist).versions()
    return [v for v in sorted(candidates) if patch.in_range(v)]


def pristine_tree(patch: Patch, version: Version, ctx, pristine_root: Path | None) -> Path:
    """The release's pristine tree: <root>/<dist>-<v>-sdist under --pristine-root, else the one
    patchctl builds and caches from the package index (as `patchctl smoke` does)."""
    engine = get_engine(patch.engine)
    if pristine_root:
        return pristine_root / f"{engine.dist}-{version}-sdist"
    from patchctl.smoke import trees
    from patchctl.sources import fetch

    return trees.pristine_tree(fetch.release(engine, version, ctx, prefer_sdist=True))


def make_variant(patch: Patch, recipe: Recipe, shipped: dict[str, bytes], tree: Path) -> tuple[bytes, dict[str, bytes]]:
    """(the variant for this pristine tree, the edited upstream files)."""
    with tempfile.TemporaryDirectory(prefix=f"pc-{patch.name}-") as tmp:
        repo = Path(tmp)
        gitutil.init(repo)
        files = recipe.files(tree)
        for rel in files:
            dst = repo / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree / rel, dst)
            shutil.copymode(tree / rel, dst)
        gitutil.commit_all(repo, "pristine")
        for rel in files:
            p = repo / rel
            p.write_text(recipe.edit(rel, p.read_text()))
        for rel, data in shipped.items():
            dst = repo / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)
        gitutil.commit_all(repo, f"{patch.title}\n\n{patch.why}\n")
        result = {rel: (repo / rel).read_bytes() for rel in files}
        return gitutil.format_patch(repo), result


def applied_result(variant: bytes, tree: Path, files: list[str], exclude: list[str]) -> dict[str, bytes] | None:
    """Contents of `files` after `git apply` of `variant` onto a copy of them (the files the
    variant adds left out)."""
    with tempfile.TemporaryDirectory(prefix="pc-apply-") as tmp:
        root = Path(tmp)
        for rel in files:
            dst = root / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree / rel, dst)
        (root / "v.patch").write_bytes(variant)
        excludes = [f"--exclude={rel}" for rel in exclude]
        if gitutil.git(root, "apply", "-p1", *excludes, "v.patch", check=False).returncode != 0:
            return None
        return {rel: (root / rel).read_bytes() for rel in files}


def applies(variant: bytes, tree: Path) -> bool:
    with tempfile.TemporaryDirectory(prefix="pc-check-") as tmp:
        file = Path(tmp) / "v.patch"
        file.write_bytes(variant)
        return gitutil.git(tree, "apply", "--check", "-p1", str(file), check=False).returncode == 0


def generate(
    patch: Patch,
    ctx=None,
    *,
    sources: dict[str, Path] | None = None,
    pristine_root: Path | None = None,
    repo: Path | None = None,
    releases: list[Version] | None = None,
) -> Generated:
    """Every variant file of `patch` as its recipe, its sources and the real releases give them.
    `sources` replaces listed sources by other files; the rest are read below `repo` (default:
    the folder that holds the patch's store)."""
    from patchctl.sources import fetch

    ctx = ctx or fetch.SourceContext()
    recipe = recipe_for(patch)
    repo = repo or patch.directory.parent.parent.parent
    sources = {**{s: repo / s for s in patch.generated_by["sources"]}, **(sources or {})}
    data: dict[str, bytes] = {}
    for source in sorted(recipe_sources(recipe)):
        if not sources[source].is_file():
            raise SystemExit(f"{patch.engine}/{patch.name}: source {sources[source]} is missing")
        data[source] = sources[source].read_bytes()
    chosen: dict[str, str] = {}
    variants: dict[str, bytes] = {}
    touched: dict[str, list[str]] = {}
    shipped_by: dict[str, dict[str, bytes]] = {}
    current: str | None = None
    for version in release_versions(patch, ctx, pristine_root, releases):
        tree = pristine_tree(patch, version, ctx, pristine_root)
        shipped = shipped_for(recipe, tree, data)
        variant, result = make_variant(patch, recipe, shipped, tree)
        if current is not None and shipped_by[current] == shipped and applies(variants[current], tree):
            # Reuse the older variant only if it makes exactly the same files (the shipped ones
            # compared above: `git apply` of an added file does not read the tree).
            files = sorted(set(touched[current]) | set(result))
            want = {rel: result.get(rel, (tree / rel).read_bytes()) for rel in files}
            if applied_result(variants[current], tree, files, list(recipe.ships)) == want:
                chosen[str(version)] = current
                continue
        if not applies(variant, tree):
            raise SystemExit(f"{patch.engine}/{patch.name}: fresh variant for {version} does not apply")
        current = f"{version}.patch"
        variants[current] = variant
        touched[current] = sorted(result)
        shipped_by[current] = shipped
        chosen[str(version)] = current
    return Generated(patch, chosen, variants)


def differences(generated: Generated) -> list[str]:
    """What differs between the generated variants and the committed ones (their files and their
    series.yaml pins), one line per variant file; empty when the store is up to date."""
    patch = generated.patch
    where = f"{patch.engine}/{patch.name}"
    committed = {v.filename: v for v in patch.variants}
    problems = []
    for name, data in sorted(generated.variants.items()):
        variant = committed.get(name)
        if variant is None:
            problems.append(f"{where}/{name}: missing (the sources give it)")
            continue
        if variant.path.read_bytes() != data:
            problems.append(f"{where}/{name}: differs from what its sources give")
        if variant.pinned_sha256 != hashlib.sha256(data).hexdigest():
            problems.append(
                f"{where}/{name}: series.yaml pin {variant.pinned_sha256} is not the generated "
                f"sha256 {hashlib.sha256(data).hexdigest()}"
            )
    for name in sorted(set(committed) - set(generated.variants)):
        problems.append(f"{where}/{name}: no longer generated (stale)")
    return problems


def write(generated: Generated) -> list[str]:
    """Write the generated variant files, remove the patch's others; the files changed."""
    directory = generated.patch.directory
    changed = []
    for old in sorted(directory.glob("*.patch")):
        if old.name not in generated.variants:
            old.unlink()
            changed.append(f"{old.name} (removed)")
    for name, data in generated.variants.items():
        file = directory / name
        if not file.is_file() or file.read_bytes() != data:
            file.write_bytes(data)
            changed.append(name)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 naming every variant file (or pin) that is out of date"
    )
    ap.add_argument("--only", metavar="NAME", help="only this patch")
    ap.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="PATH=FILE",
        help="generate as if source PATH (as patch.yaml lists it) held FILE's bytes",
    )
    ap.add_argument("--kernel", metavar="FILE", help=f"same as --source {KERNEL}=FILE")
    ap.add_argument("--store", type=Path, help="patch store (default: the repository's patches/)")
    ap.add_argument(
        "--pristine-root", type=Path, help="<root>/<dist>-<v>-sdist trees (default: patchctl's cached pristine trees)"
    )
    ap.add_argument("--index-url", help="package index (default: pip's configuration)")
    ap.add_argument("--offline", action="store_true", help="use only patchctl's cache")
    ap.add_argument(
        "--release",
        action="append",
        type=Version,
        metavar="VERSION",
        help="only this release (repeatable; default: every release the index lists)",
    )
    args = ap.parse_args(argv)

    from patchctl.sources import fetch

    # The user's git configuration stays out of the variants' bytes (gitutil fixes the identity).
    os.environ.setdefault("GIT_CONFIG_GLOBAL", os.devnull)
    sources = {}
    for item in args.source + ([f"{KERNEL}={args.kernel}"] if args.kernel else []):
        path, sep, file = item.partition("=")
        if not sep:
            ap.error(f"--source {item!r}: expected PATH=FILE")
        sources[path] = Path(file)
    store = Store.open(args.store)
    patches = [p for p in generated_patches(store) if not args.only or p.name == args.only]
    if not patches:
        ap.error(f"no patch declares generated_by: {GENERATOR}" + (f" named {args.only}" if args.only else ""))
    unknown = set(sources) - {s for p in patches for s in p.generated_by["sources"]}
    if unknown:
        ap.error(f"--source: no patch lists {', '.join(sorted(unknown))} among its sources")
    ctx = fetch.SourceContext(index_url=args.index_url, offline=args.offline)
    problems: list[str] = []
    for patch in patches:
        generated = generate(
            patch, ctx, sources=sources, pristine_root=args.pristine_root, repo=store.root.resolve().parent, releases=args.release
        )
        print(f"== {patch.engine}/{patch.name}")
        for version, name in generated.chosen.items():
            print(f"  {version}: {name}")
        for name, data in sorted(generated.variants.items()):
            print(f"  {name} sha256={hashlib.sha256(data).hexdigest()}")
        if args.check:
            problems += differences(generated)
        else:
            for name in write(generated):
                print(f"  wrote {name}")
    if args.check:
        for line in problems:
            print(f"out of date: {line}")
        stale = {line.split(": ", 1)[0] for line in problems}
        print(f"{len(stale)} variant file(s) out of date" if stale else "every generated variant is up to date")
        return 1 if problems else 0
    print("review the variants (git diff patches/), then `patchctl pin`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
