"""No --tokenizer: the served model name is not a tokenizer id; the server's model path is.

Hugging Face is unreachable (HF_HUB_OFFLINE=1): loading by the served name must fail, loading by the
path the fake server reports (a tiny tokenizer saved in a temp dir) must work."""

import pytest

from checklib.sglang.bench_fixtures import assert_sane, run_bench


def test_patched_asks_server_for_model_path(patched_tree, reasoning_server, tmp_path):
    proc, metrics = run_bench(patched_tree, reasoning_server, tmp_path, backend="sglang", stream=True, tokenizer=False)
    assert_sane(proc, metrics, timing=True)


@pytest.mark.pristine_fails
def test_pristine_uses_served_name(pristine_tree, reasoning_server, tmp_path):
    proc, metrics = run_bench(pristine_tree, reasoning_server, tmp_path, backend="sglang", stream=True, tokenizer=False)
    assert proc.returncode != 0 and metrics is None, proc.stdout[-2000:]
