"""Text mode of a conflict (issue 24, item 5): apply/ensure print the outcome table and the failing
hunk with the upstream lines around it (what --json has), and the hint names `patchctl rebase ENGINE
--onto VERSION`; a hunk whose upstream file is shorter than where it was expected says rebase finds
where the code moved, not an empty "upstream near line N:"."""

from __future__ import annotations

from click.testing import CliRunner
from support.fixtures import PRISTINE

from patchctl.cli.main import main


def text(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_a_conflict_prints_the_table_the_hunk_and_the_rebase_hint(builder, tree):
    other = dict(PRISTINE, **{"vllm/utils.py": "something else\n"})
    builder.add("vllm", "bad", variants={"1.0": builder.variant(other, {"vllm/utils.py": "x\n"})})
    for command in ("apply", "ensure"):
        code, out, err = text(command, "vllm@1.0", "--target", str(tree), "--store", str(builder.root))
        assert code == 1
        assert "bad" in out and "conflict" in out, out  # the table
        assert "expected:" in out and "something else" in out  # the hunk as the variant expected it
        assert "upstream near line" in out and "def helper():" in out  # the upstream lines around it
        assert "patchctl rebase vllm --onto 1.0" in err, err
        assert "see the report" not in err


def test_an_empty_upstream_excerpt_says_the_code_moved(builder, tree):
    longer = dict(PRISTINE, **{"vllm/loader.py": "".join(f"line {i}\n" for i in range(1, 101))})
    patched = "".join(f"line {i}\n" if i != 90 else "ninety\n" for i in range(1, 101))
    builder.add("vllm", "far", variants={"1.0": builder.variant(longer, {"vllm/loader.py": patched})})
    code, out, err = text("apply", "vllm@1.0", "--target", str(tree), "--store", str(builder.root))
    assert code == 1
    assert "upstream near line 87:" in out or "upstream near line" in out
    assert "the code moved" in out and "patchctl rebase vllm --onto 1.0" in out, out
