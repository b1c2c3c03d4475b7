"""triton-sparse-mla on vLLM 0.24+ falls back from FLASHINFER_MLA_SPARSE_SM120 when the installed
FlashInfer's MLA decode does not take the `kv_scale_format=` that backend passes. Its probe
(`accepts_keyword` in the shipped backend source) is run here on the real signatures of the
FlashInfer releases the vLLM releases pin: 0.6.12 (vLLM 0.24.0) and 0.6.13 (0.25.x) lack it,
0.6.14 (0.26.0) has it. The wheels come from the package index; the function's signature is
rebuilt from its source (FlashInfer itself needs CUDA libraries to import)."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "patches/vllm/triton-sparse-mla/src/triton_mla_sparse_v24.py"
FUNCTION = "trtllm_batch_decode_with_kv_cache_mla"


def _function_from(source: str, name: str, namespace: dict, *, body: bool = False):
    """`name` from `source`, its signature kept (names, kinds, which have defaults); decorators,
    annotations, default values and (unless `body`) the body dropped."""
    fn = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list, fn.returns = [], None
    if not body:
        fn.body = [ast.Pass()]
    args = fn.args
    for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
        if a is not None:
            a.annotation = None
    args.defaults = [ast.Constant(None) for _ in args.defaults]
    args.kw_defaults = [None if d is None else ast.Constant(None) for d in args.kw_defaults]
    module = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
    exec(compile(module, name, "exec"), namespace)
    return namespace[name]


@pytest.fixture(scope="module")
def accepts_keyword():
    ns: dict = {}
    exec(compile("import inspect\n", "imports", "exec"), ns)
    return _function_from(SOURCE.read_text(), "accepts_keyword", ns, body=True)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    return tmp_path_factory.mktemp("flashinfer")


def _decode_fn(version: str, folder: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(folder), f"flashinfer-python=={version}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.skip(f"flashinfer-python=={version} could not be downloaded: {proc.stderr[-500:]}")
    wheel = next(folder.glob(f"flashinfer_python-{version}-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        source = zf.read("flashinfer/mla/_core.py").decode()
    return _function_from(source, FUNCTION, {})


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.parametrize("version, takes", [("0.6.12", False), ("0.6.13", False), ("0.6.14", True)])
def test_kv_scale_format_probe_on_the_real_signatures(accepts_keyword, wheels, version, takes):
    fn = _decode_fn(version, wheels)
    assert "sparse_mla_top_k" in fn.__code__.co_varnames  # the real function, with its sparse API
    assert accepts_keyword(fn, "kv_scale_format") is takes


def test_probe_reads_var_keyword_and_unknowable_signatures_as_accepting(accepts_keyword):
    def by_kwargs(query, **kwargs):
        pass

    def plain(query, kv_cache):
        pass

    assert accepts_keyword(by_kwargs, "kv_scale_format") is True
    assert accepts_keyword(plain, "kv_scale_format") is False
    assert accepts_keyword(print, "kv_scale_format") in (True, False)  # builtins: no crash
