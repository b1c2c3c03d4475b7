"""CPU smoke checks for gguf-qweight-suffix: the GGUF weight iterators rename only the trailing
"weight" of quantized tensors (indexer.weights_proj.weight -> indexer.weights_proj.qweight).

A tiny GLM-5 GGUF (random, seeded; indexer weights quantized in one layer) is read with the
iterators of the release tree under test. test_pristine_release_fails (marked pristine_fails)
runs the same checks on the unpatched release and requires them to fail there with the
"qweights_proj" name.
"""

from __future__ import annotations

import pathlib

import pytest

from checklib import gguf_fixtures as gf
from checklib.pristine import run_checks_on_pristine

torch = pytest.importorskip("torch")


@pytest.fixture(scope="session")
def weight_utils(patched_tree, tmp_path_factory):
    gf.use_tree(patched_tree, tmp_path_factory.mktemp("vllm-cache"))
    from vllm.model_executor.model_loader import weight_utils as module

    assert pathlib.Path(module.__file__).is_relative_to(patched_tree), module.__file__
    return module


@pytest.fixture(scope="session")
def glm(tmp_path_factory):
    return gf.build_mla_gguf(tmp_path_factory.mktemp("gguf") / "glm5-tiny.gguf", "glm-dsa", seed=11)


def name_map(tiny):
    return {g: hf for hf, (g, qt) in tiny.ckpt.items() if qt != "split"}


def expected(tiny):
    out = set()
    for hf, (_, qtype) in tiny.ckpt.items():
        if qtype == "split":
            continue
        if qtype in gf.FLOAT_TYPES:
            out.add(hf)
        else:
            out |= {hf[: -len("weight")] + "qweight", hf[: -len("weight")] + "qweight_type"}
    return out


def check(tiny, yielded):
    names = [n for n, _ in yielded]
    assert len(names) == len(set(names)), "duplicate names"
    assert "model.layers.1.self_attn.indexer.weights_proj.qweight" in names, "names yielded for weights_proj: " + ", ".join(
        n for n in names if "weights_proj" in n
    )
    got, want = set(names), expected(tiny)
    assert got == want, "unexpected: " + ", ".join(sorted(got - want)) + " | missing: " + ", ".join(sorted(want - got))
    by_name = dict(yielded)
    for hf, (_g, qtype) in tiny.ckpt.items():
        if qtype in ("split",) or qtype in gf.FLOAT_TYPES:
            continue
        base = hf[: -len("weight")]
        assert int(by_name[base + "qweight_type"]) == int(getattr(gf.Q, qtype))
        assert by_name[base + "qweight"].dtype == torch.uint8


def test_single_file_iterator_renames_suffix_only(weight_utils, glm):
    assert glm.ckpt["model.layers.1.self_attn.indexer.weights_proj.weight"][1] == "Q4_K"
    check(glm, list(weight_utils.gguf_quant_weights_iterator(str(glm.path), name_map(glm))))


def test_multi_file_iterator_renames_suffix_only(weight_utils, glm, engine_version):
    if not hasattr(weight_utils, "gguf_quant_weights_iterator_multi"):
        from packaging.version import Version

        assert engine_version < Version("0.20"), "multi-file iterator expected from 0.20"
        pytest.skip(f"vLLM {engine_version} has no multi-file GGUF iterator (added in 0.20)")
    check(glm, list(weight_utils.gguf_quant_weights_iterator_multi([str(glm.path)], name_map(glm))))


PRISTINE_FAILS = {
    "test_single_file_iterator_renames_suffix_only": "qweights_proj",
    "test_multi_file_iterator_renames_suffix_only": "qweights_proj",
}


@pytest.mark.pristine_fails
def test_pristine_release_fails(pristine_tree, tmp_path, engine_version):
    from packaging.version import Version

    results = run_checks_on_pristine(pathlib.Path(__file__).parent, pristine_tree, tmp_path)
    problems = []
    for test, needle in PRISTINE_FAILS.items():
        outcome, message = results.get(test, ("absent", ""))
        if "multi_file" in test and engine_version < Version("0.20"):
            if outcome != "skipped":
                problems.append(f"{test}: {outcome}, expected skipped before 0.20")
            continue
        if outcome != "failed" or needle not in message:
            problems.append(f"{test}: {outcome}, expected a failure mentioning {needle!r}: {message[:300]}")
    assert not problems, "\n".join(problems)
