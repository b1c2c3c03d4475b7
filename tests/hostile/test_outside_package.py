"""Item 2 of issue 23: one outside-package rule on every path that writes. A store variant, a record
or a journal naming a file beyond the engine's packages (a `.pth` that runs code at every interpreter
start, another distribution's files, a dist-info) is refused by `revert --from-release`, `refresh`,
recovery and `revert` as `check` and `apply` refuse it: nothing of it is read, deleted or written."""

import hashlib
import json
import re

import pytest
from hostile_cli import run_cli
from support.builders import install_fake_dist
from support.fixtures import PRISTINE, four_release_index

OUTSIDE = [
    "zz-other.pth",
    "othpkg/__init__.py",
    "othpkg/deep/mod.py",
    "vllm-1.0.dist-info/RECORD",
    "toplevel.py",
    "vllm_extra/x.py",
]
PRECIOUS = "precious = True\n"
PACKAGE_RULE = re.compile(r"(inside|outside) the vllm/ package")


def plant(site, rel: str, text: str = PRECIOUS) -> None:
    (site / rel).parent.mkdir(parents=True, exist_ok=True)
    (site / rel).write_text(text)


@pytest.mark.parametrize("rel", OUTSIDE)
def test_revert_from_release_touches_nothing_outside_the_package(case, tmp_path, builder, fresh_cache, rel):
    c = case("outside package: --from-release")
    with four_release_index(tmp_path, builder) as server:
        builder.add("vllm", "evil", variants={"1.0": builder.variant(PRISTINE, {rel: "import os\n"})})
        site = tmp_path / "site"
        install_fake_dist(site, "vllm", "1.0", PRISTINE)
        kept = (site / rel).read_bytes() if (site / rel).is_file() else None
        if kept is None:
            plant(site, rel)
            kept = PRECIOUS.encode()
        out = c.record(
            run_cli(
                "revert", "vllm", "--target", str(site), "--store", str(builder.root), "--from-release", "--index-url", server.url
            )
        )
    assert out.code == 2 and PACKAGE_RULE.search(out.message), out
    assert (site / rel).read_bytes() == kept


def _seal(kind: str, body: dict) -> bytes:
    from patchctl.tree.bookkeeping.record import seal

    return seal(kind, body)


@pytest.mark.parametrize("rel", OUTSIDE)
def test_recovery_writes_nothing_a_forged_journal_names_outside_the_package(case, site, rel):
    """The journal's sha256 is integrity, not authority: whoever writes the folder can seal one."""
    from patchctl.tree.bookkeeping.upgrade import JOURNAL

    c = case("outside package: recovery")
    plant(site, rel)
    evil = b"import os; os.system('id')\n"
    digest = hashlib.sha256(evil).hexdigest()
    (site / ".patchctl/vllm/blobs").mkdir(parents=True)
    (site / ".patchctl/vllm/blobs" / digest).write_bytes(evil)
    journal = {
        "schema": JOURNAL.tag,
        "pid": 1,
        "previous_state": None,
        "entries": [
            {
                "path": rel,
                "before": digest,
                "after": None,
                "before_mtime_ns": None,
                "before_bytecode": [],
                "after_mtime_ns": None,
                "after_bytecode": [],
            }
        ],
    }
    (site / ".patchctl/vllm/journal.json").write_bytes(_seal("journal", journal))
    out = c.record(run_cli("status", "vllm", "--target", str(site)))
    assert out.code == 3 and PACKAGE_RULE.search(out.message), out
    assert (site / rel).read_text() == PRECIOUS


@pytest.mark.parametrize("rel", OUTSIDE)
def test_revert_removes_nothing_a_forged_record_names_outside_the_package(case, site, store, rel):
    c = case("outside package: revert")
    assert run_cli("apply", "vllm", "--target", str(site), "--store", str(store)).code == 0
    state = site / ".patchctl/vllm/state.json"
    body = json.loads(state.read_text())["record"]
    for f in body["files"]:
        if f["path"] == "vllm/added.py":
            f["path"] = rel  # a file "the patches created": revert deletes it
    state.write_bytes(_seal("record", body))
    plant(site, rel, "NEW = True\n")
    out = c.record(run_cli("revert", "vllm", "--target", str(site)))
    assert out.code == 3 and PACKAGE_RULE.search(out.message), out
    assert (site / rel).read_text() == "NEW = True\n"


@pytest.mark.parametrize("rel", OUTSIDE)
def test_refresh_takes_no_file_outside_the_package(case, tmp_path, builder, fresh_cache, rel):
    c = case("outside package: refresh")
    with four_release_index(tmp_path, builder) as server:
        builder.add("vllm", "evil", variants={"1.0": builder.variant(PRISTINE, {rel: "import os\n"})})
        site = tmp_path / "site"
        install_fake_dist(site, "vllm", "1.0", PRISTINE)
        plant(site, rel, "import os, sys\n")
        before = (builder.root / "vllm/evil/1.0.patch").read_bytes()
        out = c.record(
            run_cli("refresh", "vllm", "evil", "--target", str(site), "--store", str(builder.root), "--index-url", server.url)
        )
    assert out.code == 2 and PACKAGE_RULE.search(out.message), out
    assert (builder.root / "vllm/evil/1.0.patch").read_bytes() == before
    assert not (site / ".patchctl").exists()
