"""`check vllm@nightly --offline` with no nightly page cached names the nightly index it needs, not
"the cache has no index page for vllm" as if the release index were missing (issue 24, item 7)."""

from __future__ import annotations

from support.invoke import run_json


def test_offline_nightly_names_the_index_it_lacks(fresh_cache, builder):
    builder.add("vllm", "nothing", variants={})
    doc = run_json(
        "check",
        "vllm@nightly",
        "--offline",
        "--nightly-source",
        "https://nightly.invalid/vllm",
        "--store",
        str(builder.root),
        expect=3,
    )
    message = doc["error"]["message"]
    assert "https://nightly.invalid/vllm" in message and "nightly source" in message, message
    assert "cached apart" in message
