"""`upstreamed` taken from patch.yaml's `upstreamed_in` says it is the metadata's word, not a proof
(issue 24, item 7); the proof is `smoke` on the pristine release."""

from __future__ import annotations

from support.builders import install_fake_dist
from support.fixtures import PRISTINE, loader_with
from support.invoke import run_json


def test_upstreamed_from_metadata_says_not_proven(builder, tmp_path):
    builder.add(
        "vllm",
        "old-fix",
        applies_to="<1.0",
        extra_meta={"upstreamed_in": ">=1.0"},
        variants={"0.9": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})},
    )
    tree = tmp_path / "site"
    install_fake_dist(tree, "vllm", "1.0", PRISTINE)
    doc = run_json("check", f"vllm@{tree}", "--store", str(builder.root), expect=0)
    patch = doc["patches"][0]
    assert patch["outcome"] == "upstreamed"
    assert "not proven" in patch["reason"] and "upstreamed_in" in patch["reason"] and "smoke" in patch["reason"]
