import json

import pytest

from patchctl.core.errors import UsageError
from patchctl.tree.bookkeeping import FileRecord, PatchRecord, StateRecord
from patchctl.validate.baseline import (
    Baseline,
    BaselineStore,
    Deployment,
    NotCompared,
    applied_patch_set,
    compare,
    not_compared,
    workload_differences,
)

DEP = Deployment("Qwen/Qwen3-8B", "0.20.1", "abc123")


def base(levels):
    return Baseline(DEP, "2026-01-01T00:00:00+00:00", levels)


def test_field_case_is_said_with_its_numbers():
    # 54.9 against an expected 57 is -3.7%: inside 5%, but reported, not silent.
    (check,) = compare({1: {"output_tok_s": 54.9}}, base({1: {"output_tok_s": 57.0}}))
    assert not check.regressed
    assert check.change == pytest.approx(-0.03684, abs=1e-4)
    text = check.describe(0.05)
    assert "54.9 vs baseline 57" in text and "-3.7%" in text


def test_drop_beyond_threshold_regresses():
    (check,) = compare({1: {"output_tok_s": 53.0}}, base({1: {"output_tok_s": 57.0}}))
    assert check.regressed and "REGRESSED" in check.describe(0.05)
    (tight,) = compare({1: {"output_tok_s": 54.9}}, base({1: {"output_tok_s": 57.0}}), threshold=0.02)
    assert tight.regressed


def test_improvement_never_regresses_and_latency_direction_is_inverted():
    checks = compare(
        {8: {"output_tok_s": 200.0, "tpot_ms_p50": 30.0}},
        base({8: {"output_tok_s": 100.0, "tpot_ms_p50": 20.0}}),
        metrics=("output_tok_s", "tpot_ms_p50"),
    )
    assert [(c.metric, c.regressed) for c in checks] == [("output_tok_s", False), ("tpot_ms_p50", True)]


def test_only_levels_measured_in_both_runs_are_compared():
    # A --concurrency 1 run against a 1/8/32 baseline: c=8 and c=32 are not compared, not failed.
    baseline = base({1: {"output_tok_s": 50.0}, 8: {"output_tok_s": 300.0}, 32: {"output_tok_s": 900.0}})
    current = {1: {"output_tok_s": 49.0}, 4: {"output_tok_s": 150.0}}
    only = ("output_tok_s",)  # the level accounting; the decode rate's own test is below
    (check,) = compare(current, baseline, metrics=only)
    assert (check.concurrency, check.current, check.regressed) == (1, 49.0, False)
    assert not_compared(current, baseline, metrics=only) == (
        NotCompared(4, "only in this run"),
        NotCompared(8, "only in the baseline"),
        NotCompared(32, "only in the baseline"),
    )
    # A level run now whose tok/s could not be measured (no usage, not streamed) is not a regression either.
    assert compare({1: {}}, baseline) == ()
    assert not_compared({1: {}}, base({1: {"output_tok_s": 50.0}}), metrics=only) == (
        NotCompared(1, "output_tok_s not measured in this run"),
    )


def test_the_decode_rate_is_compared_by_default():
    # Throughput held while decode slowed (a faster prefill hid it): the decode rate fails on its own.
    baseline = base({1: {"output_tok_s": 50.0, "decode_tok_s_p50": 60.0}})
    checks = compare({1: {"output_tok_s": 50.5, "decode_tok_s_p50": 54.0}}, baseline)
    assert [(c.metric, c.regressed) for c in checks] == [("output_tok_s", False), ("decode_tok_s_p50", True)]
    # An older baseline without it says so instead of passing silently.
    assert not_compared({1: {"output_tok_s": 50.0, "decode_tok_s_p50": 60.0}}, base({1: {"output_tok_s": 50.0}})) == (
        NotCompared(1, "decode_tok_s_p50 not in the baseline"),
    )


def test_workload_differences_name_what_changed():
    workload = {"prompt": "counting", "prompt_sha256": "a" * 16, "max_tokens": 128, "api": "chat", "streamed": True}
    same = base({1: {"output_tok_s": 1.0}})._replace(workload=workload)
    assert workload_differences(same, workload) == ()
    essay = same._replace(workload={**workload, "prompt": "essay", "prompt_sha256": "b" * 16, "max_tokens": 256})
    assert workload_differences(essay, workload) == ("prompt essay -> counting", "max_tokens 256 -> 128")
    edited = same._replace(workload={**workload, "prompt_sha256": "c" * 16})
    assert workload_differences(edited, workload) == ("the text of prompt counting changed",)
    (older,) = workload_differences(base({1: {"output_tok_s": 1.0}}), workload)
    assert "older patchctl" in older and "essay" in older


def test_unknown_metric_is_an_error():
    with pytest.raises(ValueError):
        compare({1: {"bogus": 1.0}}, base({1: {"bogus": 1.0}}), metrics=("bogus",))


def test_store_roundtrip_and_deployments_are_separate(tmp_path):
    store = BaselineStore(tmp_path)
    assert store.load(DEP) is None
    path = store.save(DEP, {1: {"output_tok_s": 57.0}})
    assert json.loads(path.read_text())["deployment"]["engine_version"] == "0.20.1"
    loaded = store.load(DEP)
    assert loaded.levels == {1: {"output_tok_s": 57.0}} and loaded.workload is None
    store.save(DEP, {1: {"output_tok_s": 57.0}}, {"prompt": "counting", "max_tokens": 128})
    assert store.load(DEP).workload == {"prompt": "counting", "max_tokens": 128}
    assert store.load(DEP._replace(patch_set="other")) is None
    assert store.load(DEP._replace(engine_version="0.20.2")) is None


def test_applied_patch_set_names_what_the_tree_runs():
    loader = (FileRecord("vllm/loader.py", "a" * 64, "b" * 64),)

    def record(*patches, files=loader):
        return StateRecord("vllm", "/t", "1.0", 0.0, tuple(PatchRecord(n, "clean", v) for n, v in patches), files)

    assert applied_patch_set(None) == "none"
    assert applied_patch_set(record(files=())) == "none"
    one = applied_patch_set(record(("loader", "1.0.patch")))
    assert len(one) == 16 and one != "none"
    assert applied_patch_set(record(("loader", "1.0.patch"))) == one  # a digest, not a timestamp
    assert applied_patch_set(record(("loader", "1.1.patch"))) != one  # another variant
    assert applied_patch_set(record(("loader", "1.0.patch"), ("utils", "1.0.patch"))) != one
    edited = record(("loader", "1.0.patch"), files=(FileRecord("vllm/loader.py", "a" * 64, "c" * 64),))
    assert applied_patch_set(edited) != one  # the same names, other bytes


def test_a_damaged_baseline_is_bad_input_not_a_traceback(tmp_path):
    store = BaselineStore(tmp_path)
    store.path_for(DEP).write_text("{not json")
    with pytest.raises(UsageError, match="not a baseline"):
        store.load(DEP)
    store.path_for(DEP).write_text(json.dumps({"format": 1, "deployment": {"model": "m"}}))
    with pytest.raises(UsageError, match="not a baseline"):
        store.load(DEP)
