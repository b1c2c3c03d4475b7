"""`patchctl show PATCH [ENGINE@VERSION]` and `list ENGINE@latest` (issue 24 item 2 and 7): a patch's
why, links and evidence without opening the YAML inside site-packages; @latest resolved on the index."""

from click.testing import CliRunner
from support.fixtures import four_release_index
from support.invoke import run_json

from patchctl.cli.main import main


def test_show_gives_the_why_links_evidence_and_store_of_a_bundled_patch():
    doc = run_json("show", "bench-chat-content-null", expect=0)
    p = doc["patch"]
    assert p["engine"] == "sglang" and p["title"].startswith("bench_serving")
    assert "reasoning_content" in p["why"]
    assert p["evidence"]["proven"] and p["evidence"]["not_proven"]
    assert p["store"].endswith("patches") or p["store"].endswith("bundled")
    assert p["version"] is None and p["chosen_variant"] is None


def test_show_with_a_version_says_which_variant_and_why():
    p = run_json("show", "bench-native-nonstream-timing", "sglang@0.5.16", expect=0)["patch"]
    assert p["version"] == "0.5.16"
    assert p["chosen_variant"] == "0.5.15.patch"
    assert "newest base <= 0.5.16" in p["chosen_why"]


def test_show_text_names_the_evidence():
    result = CliRunner().invoke(main, ["show", "bench-chat-content-null"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "proven:" in result.output and "not proven:" in result.output
    assert "applies to" in result.output


def test_an_unknown_patch_is_a_usage_error_naming_the_known_ones():
    doc = run_json("show", "no-such-patch", "sglang", expect=2)
    assert "no patch named 'no-such-patch'" in doc["error"]["message"]
    assert "bench-chat-content-null" in doc["error"]["hint"]


def test_latest_is_resolved_on_the_index_by_show_and_list(tmp_path, builder, fresh_cache):
    with four_release_index(tmp_path, builder) as server:
        common = ["--store", str(builder.root), "--no-bundled", "--index-url", server.url]
        listed = run_json("list", "vllm@latest", *common, expect=0)
        shown = run_json("show", "loader", "vllm@latest", *common, expect=0)["patch"]
    assert listed["version"] is not None  # was null: @latest was ignored
    assert listed["version"] == shown["version"]
    assert all("chosen_variant" in row for row in listed["series"])


def test_list_asks_any_other_upstream_for_its_version(tmp_path):
    """list ENGINE@UPSTREAM for the kinds beyond a version (a directory here; a file, a nightly, a
    commit or an image the same way, through the kinds' registry): it was refused with exit 2."""
    from support.builders import install_fake_dist
    from support.fixtures import PRISTINE

    install_fake_dist(tmp_path / "site", "vllm", "0.21.0", PRISTINE)
    listed = run_json("list", f"vllm@{tmp_path / 'site'}", expect=0)
    assert listed["version"] == "0.21.0"
    assert listed["series"] and all("chosen_variant" in row for row in listed["series"])
