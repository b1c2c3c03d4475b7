"""Network failures in words a user can act on: what a resolver, socket or git said, mapped to the
cause; anything else kept (shortened)."""

import pytest

from patchctl.core.errors import plain_network_reason

GIT_DNS = (
    "cannot clone or fetch https://example.invalid/x.git: fatal: unable to access "
    "'https://example.invalid/x.git/': Could not resolve host: example.invalid"
)
URLLIB3_DNS = (
    "HTTPSConnectionPool(host='example.invalid', port=443): Max retries exceeded with url: /nightly/vllm/ "
    '(Caused by NameResolutionError("<urllib3.connection.HTTPSConnection object>: Failed to resolve '
    "'example.invalid' ([Errno -3] Temporary failure in name resolution)\"))"
)


@pytest.mark.parametrize(
    "raw, words",
    [
        (GIT_DNS, "its host name does not resolve here (no DNS or no network)"),
        (URLLIB3_DNS, "its host name does not resolve here (no DNS or no network)"),
        ("[Errno 111] Connection refused", "the connection was refused"),
        ("Read timed out. (read timeout=30)", "the connection timed out"),
        ("HTTP 503", "HTTP 503"),
        ("", "unknown network error"),
    ],
)
def test_plain_network_reason(raw, words):
    assert plain_network_reason(raw) == words


def test_where_to_report_a_crash_is_the_package_metadata_url():
    """The crash message's URL is the one pyproject.toml publishes as the project's issues page."""
    from pathlib import Path

    from patchctl.core.errors import ISSUES_URL

    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert pyproject["project"]["urls"]["Issues"] == ISSUES_URL


def test_every_error_class_lives_in_errors_py():
    """One home for error classes: no other patchctl module defines an Exception subclass."""
    import ast
    from pathlib import Path

    import patchctl

    root = Path(patchctl.__file__).parent
    elsewhere = []
    for path in root.rglob("*.py"):
        if path == root / "core" / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).rpartition(".")[2] for b in node.bases}
                if any(
                    b.endswith(("Error", "Exception", "Problem", "Failed", "Damaged"))
                    or b in {"RuntimeError", "ValueError", "OSError", "Exception"}
                    for b in bases
                ):
                    elsewhere.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    assert not elsewhere, elsewhere


def test_exit_codes_are_distinct_and_documented():
    from pathlib import Path

    from patchctl.core import errors

    codes = [
        errors.EXIT_OK,
        errors.EXIT_PATCH_FAILED,
        errors.EXIT_USAGE,
        errors.EXIT_ENVIRONMENT,
        errors.EXIT_INTERNAL,
        errors.EXIT_INTERRUPTED,
    ]
    assert len(set(codes)) == len(codes) and errors.EXIT_INTERNAL not in range(4)
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    table = readme.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    for code in codes:
        assert f"\n| {code} |" in table, code
    schema_doc = (Path(__file__).parent.parent / "docs/json-schema.md").read_text()
    assert "`internal`" in schema_doc and "4 internal error" in schema_doc
