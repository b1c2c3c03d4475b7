"""Inputs that were taken without a word or crashed (issue 33, items 6c, 8b-c, 9a-c): --wait that
never ends, a deployment file others can change or redirect, a key given twice, a NUL byte or deep
nesting in a deployment file or series.yaml (exit 4 on main), `check --patch` of a name the series
lacks (exit 0, no rows) and a series.yaml that is a FIFO (skipped: an empty store)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.builders import install_fake_dist
from support.fixtures import PRISTINE, loader_with
from support.invoke import run_json

CASES = settings(
    max_examples=12,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
OTHER_UID = 65534  # nobody


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.write_text(text)
    path.chmod(mode)  # not the umask's: a group-writable file is refused
    return path


@pytest.fixture
def tree(builder, tmp_path):
    """A vllm 1.0 tree and a store with one patch for it."""
    builder.add("vllm", "loader", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})})
    site = tmp_path / "site"
    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    return site, builder.root


# --- --wait: a finite number of seconds, 0 to 1e9 -------------------------------------------------

BAD_WAITS = ["nan", "NaN", "inf", "-inf", "infinity", "1e400", "-1", "-0.001", "2e9", "soon", ""]


@pytest.mark.parametrize("value", BAD_WAITS)
@pytest.mark.parametrize("command", ["ensure", "apply", "status", "revert"])
def test_a_wait_that_is_not_finite_seconds_is_a_usage_error(tree, command, value):
    site, store = tree
    extra = ("--store", str(store)) if command in ("ensure", "apply") else ()
    doc = run_json(command, "vllm", "--target", str(site), *extra, "--wait", value, expect=2)
    assert doc["error"]["kind"] == "usage"
    assert "--wait" in doc["error"]["message"] and repr(value) in doc["error"]["message"]


@pytest.mark.parametrize("value", ["0", "0.5", "30", "1e9"])
def test_a_finite_wait_is_taken(tree, value):
    site, _ = tree
    run_json("status", "vllm", "--target", str(site), "--wait", value, expect=0)


@pytest.mark.parametrize("value", [".nan", ".NaN", ".inf", "-.inf", "1.0e+400", "-1", "2000000000", "-0.5"])
def test_a_deployment_wait_that_is_not_finite_seconds_is_a_usage_error(tree, tmp_path, value):
    site, store = tree
    path = write(tmp_path / "d.yaml", f"engine: vllm\ntarget: {site}\nstores: [{store}]\nwait: {value}\n")
    doc = run_json("ensure", "--deployment", str(path), expect=2)
    assert str(path) in doc["error"]["message"] and "line 4" in doc["error"]["message"]
    assert "wait" in doc["error"]["message"]


# --- NUL bytes, deep nesting and keys given twice in a deployment file ------------------------------


@pytest.mark.parametrize(
    "key,value,line",
    [
        ("target", '"/srv/a\\0b"', 2),
        ("python", '"/usr/bin/py\\0thon"', 2),
        ("stores", '["/etc/s\\0"]', 2),
        ("source", '"0.5\\0"', 2),
        ("index_url", '"http://x\\0/simple"', 2),
        ("validate", '{golden: "/g\\0"}', 2),
    ],
)
def test_a_nul_byte_in_a_deployment_file_names_key_and_line(tmp_path, key, value, line):
    path = write(tmp_path / "d.yaml", f"engine: vllm\n{key}: {value}\n")
    doc = run_json("ensure", "--deployment", str(path), expect=2)
    message = doc["error"]["message"]
    assert f"deployment file {path} line {line}: {key}" in message and "NUL byte" in message, message


NESTING = st.sampled_from([65, 500, 5_000, 20_000, 100_000])


@CASES
@given(depth=NESTING, style=st.sampled_from(["flow-list", "flow-map", "block"]), key=st.sampled_from(["x", "stores"]))
def test_a_deeply_nested_deployment_file_is_a_usage_error(tmp_path, depth, style, key):
    if style == "flow-list":
        value = "[" * depth + "]" * depth
    elif style == "flow-map":
        value = "{a: " * depth + "1" + "}" * depth
    else:
        value = "\n  " + "- " * depth + "1"  # block sequences, nested on one line
    path = write(tmp_path / "d.yaml", f"engine: vllm\n{key}: {value}\n")
    doc = run_json("ensure", "--deployment", str(path), expect=2)
    assert str(path) in doc["error"]["message"] and "nested deeper than 64 levels" in doc["error"]["message"]


@CASES
@given(
    keys=st.lists(st.sampled_from(["wait", "target", "stores", "bundled", "index_url"]), min_size=1, max_size=4, unique=True),
    twice=st.integers(0, 3),
    quoted=st.booleans(),
)
def test_a_key_given_twice_is_a_usage_error_naming_key_and_line(tmp_path, keys, twice, quoted):
    values = {"wait": "5", "target": "/t", "stores": "[/s]", "bundled": "true", "index_url": "http://i/simple"}
    lines = ["engine: vllm"] + [f"{k}: {values[k]}" for k in keys]
    again = keys[twice % len(keys)]
    lines.append(f"{repr(again) if quoted else again}: {values[again]}")
    path = write(tmp_path / "d.yaml", "\n".join(lines) + "\n")
    doc = run_json("ensure", "--deployment", str(path), expect=2)
    message = doc["error"]["message"]
    assert f"line {len(lines)}: key '{again}' given twice (first on line {keys.index(again) + 2})" in message, message


# --- who may change the deployment file: root or this user, nobody else ----------------------------


@pytest.mark.parametrize("mode", [0o664, 0o660, 0o620, 0o670, 0o666, 0o646, 0o602])
def test_a_deployment_file_others_may_write_is_refused(tmp_path, mode):
    path = write(tmp_path / "d.yaml", "engine: vllm\n", mode)
    doc = run_json("ensure", "--deployment", str(path), expect=2)
    assert str(path) in doc["error"]["message"] and f"mode {mode:04o}" in doc["error"]["message"]
    assert "writable by" in doc["error"]["message"]


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o600, 0o444, 0o604])
def test_a_deployment_file_only_its_owner_may_write_is_read(served_file, mode):
    path, site = served_file
    path.chmod(mode)
    assert run_json("ensure", "--deployment", str(path), expect=0)["deployment"] == str(path)


@pytest.fixture
def served_file(tree, tmp_path):
    site, store = tree
    return write(tmp_path / "d.yaml", f"engine: vllm\ntarget: {site}\nstores: [{store}]\n"), site


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file or link to another user")


@needs_root
@pytest.mark.parametrize("uid", [OTHER_UID, 1, 1000, 12345, 65533])
def test_a_deployment_file_another_user_owns_is_refused(tmp_path, uid):
    path = write(tmp_path / "d.yaml", "engine: vllm\n")
    os.chown(path, uid, -1)
    doc = run_json("ensure", "--deployment", str(path), expect=2)
    assert f"owned by uid {uid}" in doc["error"]["message"]


@needs_root
@pytest.mark.parametrize("where", ["etc", "etc/patchctl", "etc/patchctl/deep", "one", "a/b/c/d"])
def test_a_folder_symlink_another_user_owns_is_refused(served_file, tmp_path, where):
    real, _ = served_file
    folder = tmp_path / "real" / where
    folder.mkdir(parents=True)
    os.replace(real, folder / "d.yaml")
    link = tmp_path / "via"
    link.symlink_to(tmp_path / "real" / where.split("/")[0])
    rest = "/".join(where.split("/")[1:])
    path = link / rest / "d.yaml" if rest else link / "d.yaml"
    assert run_json("ensure", "--deployment", str(path), expect=0)["deployment"] == str(folder / "d.yaml")
    os.lchown(link, OTHER_UID, OTHER_UID)
    doc = run_json("ensure", "--deployment", str(path), expect=2)
    assert f"{link} is a symlink owned by uid {OTHER_UID}" in doc["error"]["message"], doc["error"]


@needs_root
def test_a_relative_link_chain_is_followed_and_checked_hop_by_hop(served_file, tmp_path):
    real, _ = served_file
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "hop").symlink_to("../d.yaml")
    (tmp_path / "y").symlink_to("x")
    path = tmp_path / "y" / "hop"
    assert run_json("ensure", "--deployment", str(path), expect=0)["deployment"] == str(real)
    os.lchown(tmp_path / "x" / "hop", OTHER_UID, OTHER_UID)
    assert "x/hop is a symlink owned by uid" in run_json("ensure", "--deployment", str(path), expect=2)["error"]["message"]


# --- check --patch NAME the series lacks ------------------------------------------------------------


@pytest.mark.parametrize("names", [("no-such-patch",), ("Loader",), ("loader", "lodaer"), ("loader.",), ("x" * 200,)])
def test_check_refuses_a_patch_the_series_lacks(tree, names):
    _, store = tree
    args = [a for name in names for a in ("--patch", name)]
    doc = run_json("check", "vllm@1.0", *args, "--store", str(store), "--no-bundled", "--offline", expect=2)
    wrong = next(n for n in names if n != "loader")
    assert doc["error"]["message"] == f"no patch {wrong!r} in the vllm series"
    assert "loader" in doc["error"]["hint"]


# --- series.yaml that is not a regular file ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "folder", "socket", "fifo-link", "fifo-in-second-store"])
@pytest.mark.parametrize("command", ["lint", "apply", "check"])
def test_a_series_that_is_not_a_regular_file_is_exit_3_naming_it(tree, tmp_path, kind, command):
    import socket

    site, store = tree
    stores = [store]
    where = store / "vllm" / "series.yaml"
    if kind == "fifo-in-second-store":
        (tmp_path / "second" / "vllm").mkdir(parents=True)
        where = tmp_path / "second" / "vllm" / "series.yaml"
        stores.append(tmp_path / "second")
    else:
        where.unlink()
    if kind in ("fifo", "fifo-in-second-store"):
        os.mkfifo(where)
    elif kind == "folder":
        where.mkdir()
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(where))
        sock.close()
    else:
        os.mkfifo(tmp_path / "fifo")
        where.symlink_to(tmp_path / "fifo")
    store_args = [a for s in stores for a in ("--store", str(s))]
    args = {"lint": ["lint"], "apply": ["apply", "vllm", "--target", str(site)], "check": ["check", "vllm@1.0", "--offline"]}[
        command
    ]
    doc = run_json(*args, *store_args, "--no-bundled", expect=3)
    assert f"{where} is not a regular file" in doc["error"]["message"], doc["error"]


# --- pin reads the series it rewrites as every reader does ------------------------------------------


@pytest.mark.parametrize(
    "text,said",
    [
        ("engine: vllm\npatches: [\n", "not valid YAML"),
        ("engine: vllm\npatches: []\nengine: vllm\n", "key 'engine' given twice"),
        ('engine: vllm\npatches: "\\0"\n', "NUL byte"),
        ("engine: vllm\npatches: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested deeper than 64 levels"),
        ("engine: vllm\nmatrix_since: .nan\npatches: []\n", "not a finite number"),
        ("engine: vllm\npatches: [{name: a, variants: {1.0.patch: " + "9" * 30 + "}}]\n", "out of range"),
    ],
)
def test_pin_of_a_damaged_series_is_a_store_error_naming_it(tmp_path, text, said):
    series = tmp_path / "store" / "vllm" / "series.yaml"
    series.parent.mkdir(parents=True)
    series.write_text(text)
    doc = run_json("pin", "--store", str(tmp_path / "store"), expect=2)
    assert doc["error"]["kind"] == "store" and str(series) in doc["error"]["message"] and said in doc["error"]["message"]


# --- YAML aliases of lists and mappings: a billion values, or a loop, from a few lines ---------------


def _laughs(levels: int) -> str:
    lines = ["  a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n" + "\n".join(lines)


ALIASES = [_laughs(12), _laughs(3), " &a [*a]", " &m {k: &n [*m]}", "\n  a: &x {k: 1}\n  b: *x"]
ALIAS_IDS = ["9^12-values", "9^3-values", "a-list-in-itself", "a-loop-through-a-mapping", "a-mapping-twice"]


@pytest.mark.parametrize("value", ALIASES, ids=ALIAS_IDS)
def test_an_alias_of_a_list_or_mapping_in_a_deployment_file_is_refused(tmp_path, value):
    path = write(tmp_path / "d.yaml", f"engine: vllm\nx:{value}\n")
    doc = run_json("ensure", "--deployment", str(path), expect=2)
    assert str(path) in doc["error"]["message"] and "repeats a list or mapping" in doc["error"]["message"]


@pytest.mark.parametrize("value", ALIASES, ids=ALIAS_IDS)
def test_an_alias_of_a_list_or_mapping_in_a_series_is_a_store_error(tree, value):
    _, store = tree
    series = store / "vllm" / "series.yaml"
    text = series.read_text()
    assert "engine: vllm\n" in text
    series.write_text(text.replace("engine: vllm\n", f"engine:{value}\n"))  # main hung printing it (repr)
    doc = run_json("list", "vllm@1.0", "--store", str(store), "--no-bundled", expect=2)
    assert str(series) in doc["error"]["message"] and "repeats a list or mapping" in doc["error"]["message"]


@pytest.mark.parametrize("shared", [[1, 2], {"k": "v"}, [{"a": [1]}], {"x": [1, {"y": 2}]}, []])
def test_what_dump_yaml_writes_load_yaml_reads_again(shared):
    from patchctl.core.yamlio import dump_yaml, load_yaml

    doc = {"a": shared, "b": [shared, shared]}  # the same object thrice: written out, no alias
    assert load_yaml(dump_yaml(doc)) == doc


# --- what the engine's interpreter answers a probe (a service user's venv may print anything) ---------


@pytest.mark.parametrize("answer", ["[" * 100_000 + "]" * 100_000, "NaN", '{"vllm": "1.0\\u0000"}', "1e400", "9" * 30])
def test_a_probe_answer_past_the_bounds_is_an_environment_error(tmp_path, answer):
    from patchctl.core.errors import EnvironmentProblem
    from patchctl.core.interpreter import probe

    with pytest.raises(EnvironmentProblem) as raised:
        probe(sys.executable, f"print({answer!r})")
    assert sys.executable in raised.value.message and raised.value.exit_code == 3
