"""The matrix over several real-format releases on a local index: outcomes, shards, merge, diff."""

import pytest
import yaml
from support.builders import build_wheel
from support.fixtures import PRISTINE, four_release_index, loader_with
from support.index_server import IndexServer
from support.invoke import run_json


@pytest.fixture
def index(tmp_path, builder):
    with four_release_index(tmp_path, builder) as server:
        yield server, builder.root


run = run_json


def test_matrix_outcomes_shards_and_diff(index, tmp_path, fresh_cache):
    server, store = index
    common = ["--index-url", server.url, "--store", str(store), "--no-nightly"]
    full = tmp_path / "full.yaml"
    run("matrix", "-o", str(full), "--markdown", str(tmp_path / "m.md"), *common, expect=0)
    doc = yaml.safe_load(full.read_text())
    cells = {v: r["patches"]["loader"]["outcome"] for v, r in doc["engines"]["vllm"]["versions"].items()}
    assert cells == {"1.0": "clean", "1.1": "offset", "1.2": "conflict", "1.3": "upstreamed"}
    assert all(r["sha256"] for r in doc["engines"]["vllm"]["versions"].values())
    assert "❌ conflict" in (tmp_path / "m.md").read_text()
    # shards merge back to the same matrix
    shards = []
    for i in (1, 2):
        out = tmp_path / f"s{i}.yaml"
        run("matrix", "--shard", f"{i}/2", "-o", str(out), *common, expect=0)
        shards.append(str(out))
    run("matrix", "merge", *shards, "-o", str(tmp_path / "merged.yaml"), expect=0)
    merged = yaml.safe_load((tmp_path / "merged.yaml").read_text())
    strip = lambda d: {v: r["patches"] for v, r in d["engines"]["vllm"]["versions"].items()}  # noqa: E731
    assert strip(merged) == strip(doc)
    # a previous run where 1.2 still applied: now a regression, exit 1, first bad version named
    previous = yaml.safe_load(full.read_text())
    previous["engines"]["vllm"]["versions"]["1.2"]["patches"]["loader"]["outcome"] = "clean"
    (tmp_path / "prev.yaml").write_text(yaml.safe_dump(previous))
    diff = run("matrix", "diff", str(tmp_path / "prev.yaml"), str(full), expect=1)["diff"]
    assert diff["regressions"] == [
        {
            "engine": "vllm",
            "version": "1.2",
            "patch": "loader",
            "before": "clean",
            "after": "conflict",
            "first_bad_version": "1.2",
        }
    ]
    assert run("matrix", "diff", str(full), str(full), expect=0)["diff"]["regressions"] == []
    # the nightly case: the previous run did not know 1.2 at all; a new release that breaks the
    # patch is still a regression (compared with the newest release the previous run knew)
    del previous["engines"]["vllm"]["versions"]["1.2"]
    del previous["engines"]["vllm"]["versions"]["1.3"]
    (tmp_path / "prev2.yaml").write_text(yaml.safe_dump(previous))
    diff = run("matrix", "diff", str(tmp_path / "prev2.yaml"), str(full), expect=1)["diff"]
    assert [(r["version"], r["before"], r["after"]) for r in diff["regressions"]] == [("1.2", "offset", "conflict")]


def test_matrix_with_smoke_records_results_and_evidence(tmp_path, builder, fresh_cache):
    import sys

    files = tmp_path / "files"
    files.mkdir()
    variant = builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})
    folder = builder.add(
        "vllm",
        "loader",
        variants={"1.0": variant},
        extra_meta={"smoke": {"env": "test"}, "evidence": {"proven": ["x"], "not_proven": ["SM120 itself"]}},
    )
    (folder / "checks").mkdir()
    (folder / "checks" / "test_it.py").write_text(
        "def test_it(patched_tree):\n    assert 'ten' in (patched_tree / 'vllm/loader.py').read_text()\n"
    )
    with IndexServer(files) as server:
        server.add("vllm", build_wheel(files, "vllm", "1.0", PRISTINE))
        out = tmp_path / "m.yaml"
        run(
            "matrix",
            "--smoke",
            "--python",
            sys.executable,
            "--no-nightly",
            "-o",
            str(out),
            "--index-url",
            server.url,
            "--store",
            str(builder.root),
            expect=0,
        )
    doc = yaml.safe_load(out.read_text())
    cell = doc["engines"]["vllm"]["versions"]["1.0"]["patches"]["loader"]
    assert cell["smoke"]["status"] == "passed" and cell["evidence"] == "applies + CPU checks passed"
    assert doc["engines"]["vllm"]["evidence"]["loader"]["not_proven"] == ["SM120 itself"]


def closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the block ends: nothing listens there


def test_unreachable_nightly_is_a_failed_row_and_exit_1(index, tmp_path, fresh_cache):
    server, store = index
    out = tmp_path / "m.yaml"
    nightly = f"http://127.0.0.1:{closed_port()}/simple"
    doc = run(
        "matrix",
        "-o",
        str(out),
        "--index-url",
        server.url,
        "--store",
        str(store),
        "--nightly-source",
        nightly,
        "--markdown",
        str(tmp_path / "m.md"),
        expect=1,
    )
    assert doc["nightly_failed"] == ["vllm"] and "nightly FAILED" in doc["message"]
    data = yaml.safe_load(out.read_text())["engines"]["vllm"]
    row = data["versions"]["nightly"]
    assert row["outcome"] == "failed" and row["patches"] == {} and "unreachable" in row["error"]
    assert "the connection was refused" in row["error"] and "--nightly-source" in row["error"]  # why, then the way out
    assert data["nightly"].startswith("failed: ") and "unreachable" in data["nightly"]
    assert list(data["versions"])[-1] == "nightly"  # still sorted last, and the releases are all there
    assert {v: r["patches"]["loader"]["outcome"] for v, r in data["versions"].items() if v != "nightly"} == {
        "1.0": "clean",
        "1.1": "offset",
        "1.2": "conflict",
        "1.3": "upstreamed",
    }
    from patchctl.matrix import build as matrix

    matrix.load(out)  # the failed row is a valid document
    assert "| nightly | error |" in (tmp_path / "m.md").read_text()


def test_disabled_nightly_is_skipped_not_failed(index, tmp_path, fresh_cache, monkeypatch):
    server, store = index
    common = ["--index-url", server.url, "--store", str(store)]
    out = tmp_path / "m.yaml"
    # --no-nightly, even with an unreachable source named
    doc = run(
        "matrix",
        "-o",
        str(out),
        *common,
        "--no-nightly",
        "--nightly-source",
        f"http://127.0.0.1:{closed_port()}/simple",
        expect=0,
    )
    assert "nightly_failed" not in doc
    data = yaml.safe_load(out.read_text())["engines"]["vllm"]
    assert data["nightly"] == "skipped: disabled" and "nightly" not in data["versions"]
    # an engine whose nightly kind is `none` (here through the config file)
    config = tmp_path / "config.yaml"
    config.write_text("nightly:\n  vllm:\n    kind: none\n")
    monkeypatch.setenv("PATCHCTL_CONFIG", str(config))
    run("matrix", "-o", str(out), *common, expect=0)
    data = yaml.safe_load(out.read_text())["engines"]["vllm"]
    assert data["nightly"] == "skipped: disabled" and "nightly" not in data["versions"]
