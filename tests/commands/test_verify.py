"""`--verify` (issue 23, provenance): range reads keep their sparse cost and say that their bytes are as
the index served them; --verify downloads the whole artifact and checks it against the index's sha256."""

import os

from support.builders import build_wheel
from support.fixtures import PRISTINE, loader_with
from support.index_server import IndexServer
from support.invoke import run_json


def test_check_says_whether_its_bytes_were_verified(tmp_path, builder, fresh_cache):
    builder.add("vllm", "loader", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "x\n"})})})
    files = tmp_path / "files"
    files.mkdir()
    # 4 MB that does not compress: range reads of the one patched file cost less than the whole wheel.
    tree = dict(PRISTINE, **{"vllm/_big.bin": os.urandom(4 << 20)})
    with IndexServer(files) as server:
        server.add("vllm", build_wheel(files, "vllm", "1.0", tree))
        common = ["--store", str(builder.root), "--index-url", server.url]
        sparse = run_json("check", "vllm@1.0", *common, expect=0)["source"]
        verified = run_json("check", "vllm@1.0", *common, "--verify", expect=0)["source"]
    assert sparse["read"] == "ranges" and sparse["verified"] is False
    assert sparse["bytes_fetched"] < 1 << 20
    assert verified["read"] == "whole" and verified["verified"] is True
    assert verified["bytes_fetched"] > 4 << 20
