"""`patchctl list` says which store each patch comes from in its text table too (issue 36, item 6):
the README and the docs said so, and only --json had it."""

from __future__ import annotations

from click.testing import CliRunner
from support.fixtures import PRISTINE, loader_with
from support.invoke import run_json


def rows(*args: str) -> dict[str, list[str]]:
    """The text table's rows by patch name, each split into its cells."""
    from patchctl.cli.main import main

    result = CliRunner().invoke(main, ["list", *args])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("engine"))
    assert header.split()[-1] == "store", header  # the last column without a version
    return {cells[2]: cells for cells in (line.split() for line in lines[lines.index(header) + 1 :]) if len(cells) > 5}


def test_the_text_table_has_the_store_column(builder, monkeypatch):
    builder.add("vllm", "mine", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})})
    monkeypatch.setenv("PATCHCTL_BUNDLED", "1")  # the bundled set under the user's store
    table = rows("vllm", "--store", str(builder.root))
    assert table["mine"][-1] == str(builder.root)
    bundled = [cells for name, cells in table.items() if name != "mine"]
    assert bundled and all(cells[-1] == "bundled" for cells in bundled)
    doc = run_json("list", "vllm", "--store", str(builder.root), expect=0)
    kinds = {row["name"]: row["store_kind"] for row in doc["series"]}
    assert kinds.pop("mine") == "user" and set(kinds.values()) == {"bundled"}
