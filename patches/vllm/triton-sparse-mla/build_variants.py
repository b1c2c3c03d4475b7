#!/usr/bin/env python3
"""Regenerate the variants of `triton-sparse-mla` (and its companion
`dsa-indexer-fallback`) from the pristine vLLM trees and the source files kept
beside this script.

    python3 patches/vllm/triton-sparse-mla/build_variants.py [--only NAME]
        [--pristine-root DIR] [--kernel FILE] [--check]

For every release the patch claims (applies_to in its patch.yaml; ascending) the
edits below are applied to that release's pristine files in a scratch git repo,
committed with patchctl's fixed identity/dates and exported with
`git format-patch --zero-commit`. A new variant file is written only where the
newest variant so far does not `git apply --check` onto the release (the store
keeps as few variants as the code history needs). Stale variant files of the patch are removed. Prints the
variant chosen for every release and the sha256 of every variant file.

Deterministic: same pristine trees + same sources -> same bytes.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))
from packaging.version import Version  # noqa: E402

from patchctl import trees  # noqa: E402
from patchctl.sources import fetch
from patchctl.engines import get_engine  # noqa: E402
from patchctl.store import Store  # noqa: E402


def release_versions(name: str, pristine_root: str | None) -> list[str]:
    """The releases the patch claims (its applies_to in patch.yaml), ascending: from the
    package index, or the trees present under --pristine-root."""
    patch = Store.open(REPO / "patches").series("vllm").get(name)
    if pristine_root:
        names = (re.fullmatch(r"vllm-(\d[^-]*)-sdist", d.name) for d in pathlib.Path(pristine_root).iterdir())
        candidates = [Version(m.group(1)) for m in names if m]
    else:
        candidates = fetch.SourceContext().index().project(get_engine("vllm").dist).versions()
    return [str(v) for v in sorted(candidates) if patch.in_range(v)]


def pristine_tree(version: str, pristine_root: str | None) -> pathlib.Path:
    """The release's pristine tree: from --pristine-root (<root>/vllm-<v>-sdist) if given, else the
    one patchctl builds and caches from the package index."""
    if pristine_root:
        return pathlib.Path(pristine_root) / f"vllm-{version}-sdist"
    source = fetch.release(get_engine("vllm"), Version(version), fetch.SourceContext(), prefer_sdist=True)
    return trees.pristine_tree(source)


DEFAULT_KERNEL = REPO / "kernels" / "sparse_mla" / "triton_sparse_mla.py"

GIT_ENV = {
    "GIT_AUTHOR_NAME": "patchctl",
    "GIT_AUTHOR_EMAIL": "patchctl@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "patchctl",
    "GIT_COMMITTER_EMAIL": "patchctl@localhost",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}


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


# --------------------------------------------------------------------------
# triton-sparse-mla
# --------------------------------------------------------------------------
TSM_REGISTRY_ANCHOR = '''    FLASHMLA_SPARSE = (
        "vllm.v1.attention.backends.mla.flashmla_sparse.FlashMLASparseBackend"
    )
'''
TSM_REGISTRY_ADD = '''    # Downstream (patchctl triton-sparse-mla): sparse MLA through Triton,
    # the sparse backend for compute capability 12.x before vLLM 0.24.
    TRITON_MLA_SPARSE = (
        "vllm.v1.attention.backends.mla.triton_mla_sparse.TritonMLASparseBackend"
    )
'''
TSM_CUDA_ANCHOR = '''        device_capability = cls.get_device_capability()
        assert device_capability is not None
'''
TSM_CUDA_ADD = '''
        # Downstream (patchctl triton-sparse-mla): sparse MLA models get the
        # Triton sparse backend on 12.x (no upstream one accepts it) or when
        # forced with VLLM_TRITON_SPARSE_MLA=1; an explicit choice wins.
        from vllm.v1.attention.backends.mla.triton_mla_sparse import (
            maybe_select_triton_sparse_mla,
        )

        selected_backend = maybe_select_triton_sparse_mla(
            selected_backend, device_capability, attn_selector_config
        )
'''
TSM_ENVS_DECL_ANCHOR = "    VLLM_USE_TRITON_AWQ: bool = False\n"
TSM_ENVS_DECL_ADD = "    VLLM_TRITON_SPARSE_MLA: bool = False\n"
TSM_ENVS_DICT_ANCHOR = (
    '    "VLLM_USE_TRITON_AWQ": lambda: bool(int(os.getenv("VLLM_USE_TRITON_AWQ",'
    ' "0"))),\n'
)
TSM_ENVS_DICT_ADD = '''    # If set, sparse MLA models (DeepSeek V3.2, GLM-5) use the Triton sparse MLA
    # backend on any CUDA GPU (it is automatic on compute capability 12.x).
    "VLLM_TRITON_SPARSE_MLA": lambda: bool(
        int(os.getenv("VLLM_TRITON_SPARSE_MLA", "0"))
    ),
'''


def tsm_edit(path: str, text: str, version: str) -> str:
    if path == "vllm/v1/attention/backends/registry.py":
        return insert_after(text, TSM_REGISTRY_ANCHOR, TSM_REGISTRY_ADD, path=path)
    if path == "vllm/platforms/cuda.py":
        return insert_after(text, TSM_CUDA_ANCHOR, TSM_CUDA_ADD, path=path)
    if path == "vllm/envs.py":
        text = insert_after(text, TSM_ENVS_DECL_ANCHOR, TSM_ENVS_DECL_ADD, path=path)
        return insert_after(text, TSM_ENVS_DICT_ANCHOR, TSM_ENVS_DICT_ADD, path=path)
    raise KeyError(path)


def tsm_new_files(args) -> dict[str, bytes]:
    kernel = pathlib.Path(args.kernel)
    if not kernel.is_file():
        sys.exit(f"kernel file {kernel} is missing: the variants ship it verbatim")
    return {
        "vllm/v1/attention/backends/mla/triton_mla_sparse.py": (
            HERE / "src" / "triton_mla_sparse.py"
        ).read_bytes(),
        "vllm/v1/attention/ops/triton_sparse_mla.py": kernel.read_bytes(),
    }


# --------------------------------------------------------------------------
# dsa-indexer-fallback (companion patch, folder ../dsa-indexer-fallback)
# --------------------------------------------------------------------------
DIF_DIR = HERE.parent / "dsa-indexer-fallback"
DIF_ENVS_DECL_ANCHOR = "    VLLM_USE_DEEP_GEMM: bool = True\n"
DIF_ENVS_DECL_ADD = "    VLLM_DSA_INDEXER_FALLBACK: bool = False\n"
DIF_ENVS_DICT_ANCHOR = (
    '    "VLLM_USE_DEEP_GEMM": lambda: bool(int(os.getenv("VLLM_USE_DEEP_GEMM",'
    ' "1"))),\n'
)
DIF_ENVS_DICT_ADD = '''    # If set, the DSA indexer computes its fp8 MQA logits with the portable
    # PyTorch fallback instead of DeepGEMM (automatic where DeepGEMM does not
    # support the GPU, e.g. compute capability 12.x).
    "VLLM_DSA_INDEXER_FALLBACK": lambda: bool(
        int(os.getenv("VLLM_DSA_INDEXER_FALLBACK", "0"))
    ),
'''
DIF_DG_IMPORT = """
def _dsa_indexer_fallback() -> bool:
    # Downstream (patchctl dsa-indexer-fallback).
    from vllm.v1.attention.ops.dsa_indexer_fallback import use_indexer_fallback

    return use_indexer_fallback()

"""


def _params(text: str, func: str) -> list[str]:
    start = text.index(f"\ndef {func}(") + len(f"\ndef {func}(")
    sig = text[start : text.index(") ->", start)]
    import re

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


def dif_edit(path: str, text: str, version: str) -> str:
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
        return text
    if path == "vllm/model_executor/layers/sparse_attn_indexer.py":
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
            "    return use_indexer_fallback()\n"
        )
        return insert_after(text, anchor, add, path=path)
    raise KeyError(path)


def dif_files_for(version: str, pristine: pathlib.Path) -> list[str]:
    files = ["vllm/envs.py", "vllm/utils/deep_gemm.py"]
    sai = pristine / "vllm/model_executor/layers/sparse_attn_indexer.py"
    if sai.is_file() and "not has_deep_gemm():" in sai.read_text():
        files.append("vllm/model_executor/layers/sparse_attn_indexer.py")
    return files


def dif_new_files(args) -> dict[str, bytes]:
    return {
        "vllm/v1/attention/ops/dsa_indexer_fallback.py": (
            DIF_DIR / "src" / "dsa_indexer_fallback.py"
        ).read_bytes(),
    }


PATCHES = {
    "triton-sparse-mla": dict(
        dir=HERE,
        files=lambda v, p: [
            "vllm/v1/attention/backends/registry.py",
            "vllm/platforms/cuda.py",
            "vllm/envs.py",
        ],
        edit=tsm_edit,
        new_files=tsm_new_files,
    ),
    "dsa-indexer-fallback": dict(
        dir=DIF_DIR,
        files=dif_files_for,
        edit=dif_edit,
        new_files=dif_new_files,
        # which releases: applies_to in its patch.yaml (0.17.x/0.18.x already fall back
        # to PyTorch logits when DeepGEMM is not supported on the GPU)
    ),
}


def _title_and_why(patch_dir: pathlib.Path) -> tuple[str, str]:
    """Read `title` and `why` from patch.yaml without a YAML dependency."""
    title, why, in_why = "", [], False
    for line in (patch_dir / "patch.yaml").read_text().splitlines():
        if line.startswith("title:"):
            title = line.split(":", 1)[1].strip().strip('"')
            in_why = False
        elif line.startswith("why:"):
            in_why = True
        elif in_why:
            if line.startswith("  ") or not line.strip():
                why.append(line[2:])
            else:
                in_why = False
    return title, "\n".join(why).strip() + "\n"


def git(repo: pathlib.Path, *args: str, check=True, capture=True) -> str:
    env = dict(os.environ, **GIT_ENV)
    r = subprocess.run(
        ["git", *args], cwd=repo, env=env, check=check,
        stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE,
    )
    return r.stdout.decode() if capture else ""


def make_variant(
    name: str, spec: dict, version: str, tree: pathlib.Path, args
) -> tuple[bytes, dict[str, bytes]]:
    title, why = _title_and_why(spec["dir"])
    with tempfile.TemporaryDirectory(prefix=f"pc-{name}-{version}-") as tmp:
        repo = pathlib.Path(tmp)
        git(repo, "init", "-q")
        git(repo, "config", "core.autocrlf", "false")
        files = spec["files"](version, tree)
        for rel in files:
            dst = repo / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree / rel, dst)
            shutil.copymode(tree / rel, dst)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "pristine")
        for rel in files:
            p = repo / rel
            p.write_text(spec["edit"](rel, p.read_text(), version))
        for rel, data in spec["new_files"](args).items():
            dst = repo / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", title, "-m", why)
        result = {rel: (repo / rel).read_bytes() for rel in files}
        out = subprocess.run(
            ["git", "format-patch", "-1", "--stdout", "--zero-commit",
             "--no-signature", "--full-index", "HEAD"],
            cwd=repo, env=dict(os.environ, **GIT_ENV), check=True,
            stdout=subprocess.PIPE,
        ).stdout
        return out, result


def applied_result(
    patch: bytes, tree: pathlib.Path, files: list[str]
) -> dict[str, bytes] | None:
    """Contents of `files` after `git apply` of `patch` onto a copy of them."""
    with tempfile.TemporaryDirectory(prefix="pc-apply-") as tmp:
        root = pathlib.Path(tmp)
        for rel in files:
            dst = root / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree / rel, dst)
        pf = root / "v.patch"
        pf.write_bytes(patch)
        r = subprocess.run(
            ["git", "apply", "-p1", "--exclude=vllm/v1/attention/ops/*",
             "--exclude=vllm/v1/attention/backends/mla/triton_mla_sparse.py",
             str(pf)],
            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        if r.returncode != 0:
            return None
        return {rel: (root / rel).read_bytes() for rel in files}


def applies(patch: pathlib.Path | bytes, tree: pathlib.Path) -> bool:
    with tempfile.NamedTemporaryFile(suffix=".patch") as f:
        f.write(patch if isinstance(patch, bytes) else patch.read_bytes())
        f.flush()
        r = subprocess.run(
            ["git", "apply", "--check", "-p1", f.name], cwd=tree,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        return r.returncode == 0


def build(name: str, spec: dict, args) -> dict[str, str]:
    out_dir: pathlib.Path = spec["dir"]
    chosen: dict[str, str] = {}
    variants: dict[str, bytes] = {}
    current: str | None = None
    touched: dict[str, list[str]] = {}
    for v in release_versions(name, args.pristine_root):
        tree = pristine_tree(v, args.pristine_root)
        data, result = make_variant(name, spec, v, tree, args)
        if current is not None and applies(variants[current], tree):
            # Reuse the older variant only if it makes exactly the same files.
            files = sorted(set(touched[current]) | set(result))
            want = {rel: result.get(rel, (tree / rel).read_bytes()) for rel in files}
            if applied_result(variants[current], tree, files) == want:
                chosen[v] = current
                continue
        if not applies(data, tree):
            raise SystemExit(f"{name}: fresh variant for {v} does not apply")
        current = f"{v}.patch"
        variants[current] = data
        touched[current] = sorted(result)
        chosen[v] = current
    if not args.check:
        for old in out_dir.glob("*.patch"):
            if old.name not in variants:
                old.unlink()
        for fname, data in variants.items():
            (out_dir / fname).write_bytes(data)
    else:
        for fname, data in variants.items():
            have = out_dir / fname
            if not have.is_file() or have.read_bytes() != data:
                print(f"{name}/{fname}: out of date")
                args.stale = True
    print(f"== {name}")
    for v, f in chosen.items():
        print(f"  {v}: {f}")
    for fname, data in sorted(variants.items()):
        print(f"  {fname} sha256={hashlib.sha256(data).hexdigest()}")
    return chosen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(PATCHES))
    ap.add_argument("--pristine-root", default=None,
                    help="<root>/vllm-<v>-sdist trees (default: patchctl's cached pristine trees)")
    ap.add_argument("--kernel", default=str(DEFAULT_KERNEL))
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if a variant file is out of date")
    args = ap.parse_args()
    args.stale = False
    for name, spec in PATCHES.items():
        if args.only and name != args.only:
            continue
        build(name, spec, args)
    return 1 if args.stale else 0


if __name__ == "__main__":
    sys.exit(main())
