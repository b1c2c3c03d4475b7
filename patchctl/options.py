"""Options shared by several commands, defined once."""
from __future__ import annotations

import click

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document (docs/json-schema.md).")
store_option = click.option("--store", type=click.Path(file_okay=False), envvar="PATCHCTL_STORE",
                            help="Patch store directory (default: the repository's patches/).")
index_option = click.option("--index-url", help="Package index (default: pip's configuration, PIP_INDEX_URL).")
offline_option = click.option("--offline", is_flag=True, help="Use only the cache; never touch the network.")
python_option = click.option("--python", "python", help="Interpreter whose environment holds the engine.")
target_option = click.option("--target", "target_dir", type=click.Path(file_okay=False),
                             help="A source checkout or unpacked tree to patch instead of an installed engine.")
strict_option = click.option("--strict", is_flag=True, help="Treat fuzz as a failure.")
allow_modified_option = click.option("--allow-modified", is_flag=True,
                                     help="Accept variant files whose sha256 differs from the series pin.")
nightly_option = click.option("--nightly-source", help="Where ENGINE@nightly comes from (wheel index URL or git URL).")
repo_option = click.option("--repo", help="Git repository (URL or path) for ENGINE@git:REF.")
as_version_option = click.option("--as-version", help="Version to assume for a tree whose version cannot be read.")
wait_option = click.option("--wait", type=float, default=0.0, show_default=True,
                           help="Seconds to wait for another patchctl working on the same target.")


def source_options(f):
    for option in reversed((index_option, offline_option, nightly_option, repo_option, as_version_option)):
        f = option(f)
    return f
