"""Smoke venvs and trees are run only as built (issue 33, item 2): a planted entry with a copied
`.complete`, a tampered file, an entry another uid owns or others may write is rebuilt (the reason
said in one line), and a folder above it that others control is refused (exit 3). The venvs here
are real (`python -m venv --without-pip`); pip's step is left out (it would download)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from patchctl.core.errors import EnvironmentProblem
from patchctl.smoke import envs, sealed
from patchctl.sources.cache import ArtifactCache

SERVICE_UID = 4001
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def _chown(top: Path, uid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.chown(name, uid, uid, follow_symlinks=False)


@pytest.fixture
def profile(tmp_path, fresh_cache, monkeypatch):
    """A store with envs/test.txt; envs._run creates the venv for real (without pip) and skips pip.
    Yields (store root, builds: the list of venvs created)."""
    store = tmp_path / "store"
    (store / "envs").mkdir(parents=True)
    (store / "envs" / "test.txt").write_text("# nothing beyond pytest\n")
    builds: list[str] = []
    real_run = envs._run

    def run(cmd, what, log, *, live=False, step=None):
        if cmd[1:3] == ["-m", "venv"]:
            builds.append(cmd[-1])
            real_run([*cmd[:3], "--without-pip", *cmd[3:]], what, log)

    monkeypatch.setattr(envs, "_run", run)
    return store, builds


def _plant_pth(python: str, marker: Path) -> None:
    """Into the venv's own site-packages (found by its layout: never the base interpreter's)."""
    venv = Path(python).parent.parent
    (site,) = (venv / "lib").glob("python3*/site-packages")
    assert site.resolve().is_relative_to(venv.resolve())
    (site / "owner.pth").write_text(f"import os; open({str(marker)!r}, 'w').write('ran')\n")


def _runs_clean(python: str, marker: Path) -> None:
    subprocess.run([python, "-c", "pass"], check=True)
    assert not marker.exists(), "the planted .pth ran: the env was used as it was found"


def _copied_marker(venv: Path, marker: Path) -> None:
    """The issue's plant: an env someone else made, with the plain `.complete` copied in."""
    head = (venv / ".complete").read_text().split("seal ", 1)[0]
    shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / ".complete").write_text(head)
    _plant_pth(str(venv / "bin" / "python"), marker)


def _extra_pth(venv: Path, marker: Path) -> None:
    _plant_pth(str(venv / "bin" / "python"), marker)


def _tampered_file(venv: Path, marker: Path) -> None:
    cfg = venv / "pyvenv.cfg"
    cfg.write_text(cfg.read_text() + "# changed\n")
    activate = venv / "bin" / "activate"
    activate.write_text(activate.read_text() + f"\necho ran > {marker}\n")


def _foreign_owner(venv: Path, marker: Path) -> None:
    _chown(venv, SERVICE_UID)


def _world_writable_env(venv: Path, marker: Path) -> None:
    venv.chmod(0o777)


def _group_writable_file(venv: Path, marker: Path) -> None:
    (venv / "pyvenv.cfg").chmod(0o664)


def _relinked_python(venv: Path, marker: Path) -> None:
    python = venv / "bin" / "python"
    script = venv / "bin" / "evil"
    script.write_text(f'#!/bin/sh\necho ran > {marker}\nexec {sys.executable} "$@"\n')
    script.chmod(0o755)
    python.unlink()
    python.symlink_to("evil")


def _planted_bytecode(venv: Path, marker: Path) -> None:
    """Bytecode is code too: a new __pycache__ folder in site-packages."""
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "__pycache__").mkdir()
    (site / "__pycache__" / "sitecustomize.cpython-311.pyc").write_bytes(b"\0" * 16)


PLANTS = [
    _copied_marker,
    _extra_pth,
    _tampered_file,
    _foreign_owner,
    _world_writable_env,
    _group_writable_file,
    _relinked_python,
    _planted_bytecode,
]


@root_only
@pytest.mark.parametrize("plant", PLANTS, ids=[p.__name__.strip("_") for p in PLANTS])
def test_a_smoke_env_not_as_built_is_rebuilt_with_the_reason(profile, tmp_path, capsys, plant):
    store, builds = profile
    python = envs.ensure_env(store, "test")
    assert len(builds) == 1
    assert envs.ensure_env(store, "test") == python and len(builds) == 1, "an intact env is reused"
    sealed._checked.clear()  # another process: nothing verified yet
    marker = tmp_path / "ran"
    plant(Path(python).parent.parent, marker)
    capsys.readouterr()
    assert not envs.env_ready(store, "test")
    assert envs.ensure_env(store, "test") == python
    said = [line for line in capsys.readouterr().err.splitlines() if "rebuilding" in line]
    assert len(builds) == 2 and len(said) == 1, said
    _runs_clean(python, marker)
    assert (
        os.lstat(python).st_uid == 0
        and sealed.untrusted(ArtifactCache(Path(os.environ["PATCHCTL_CACHE_DIR"])), Path(python).parent.parent, "") is None
    )


def _foreign_cache_root(cache: Path) -> None:
    os.chown(cache, SERVICE_UID, SERVICE_UID)


def _foreign_envs(cache: Path) -> None:
    os.chown(cache / "envs", SERVICE_UID, SERVICE_UID)


def _writable_cache_root(cache: Path) -> None:
    cache.chmod(0o777)


def _group_writable_envs(cache: Path) -> None:
    (cache / "envs").chmod(0o775)


def _linked_envs(cache: Path) -> None:
    (cache / "envs").rename(cache / "elsewhere")
    (cache / "envs").symlink_to("elsewhere")


ABOVE = [_foreign_cache_root, _foreign_envs, _writable_cache_root, _group_writable_envs, _linked_envs]


@root_only
@pytest.mark.parametrize("how", ABOVE, ids=[p.__name__.strip("_") for p in ABOVE])
def test_a_cache_others_control_is_refused(profile, fresh_cache, tmp_path, how):
    store, builds = profile
    python = envs.ensure_env(store, "test")
    sealed._checked.clear()
    marker = tmp_path / "ran"
    _plant_pth(python, marker)
    how(fresh_cache)
    with pytest.raises(EnvironmentProblem) as caught:
        envs.ensure_env(store, "test")
    assert caught.value.exit_code == 3 and "patchctl runs nothing from" in str(caught.value)
    assert len(builds) == 1 and not marker.exists()


def test_a_sticky_shared_cache_root_is_fine(profile, fresh_cache):
    store, builds = profile
    envs.ensure_env(store, "test")
    fresh_cache.chmod(0o1777)
    sealed._checked.clear()
    envs.ensure_env(store, "test")
    assert len(builds) == 1


def _built(tmp_path: Path) -> tuple[ArtifactCache, Path]:
    cache = ArtifactCache(tmp_path / "cache")
    root = cache.tree("abc") / "pristine"
    (root / "vllm" / "sub").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("X = 1\n")
    (root / "vllm" / "run.sh").write_text("#!/bin/sh\n")
    (root / "vllm" / "run.sh").chmod(0o775)  # the builder's umask: tightened by seal
    (root / "vllm" / "sub" / "m.py").write_text("Y = 2\n")
    (root / "vllm" / "alias.py").symlink_to("__init__.py")
    sealed.seal(root, "format 2\nvllm-1.0.whl\n")
    sealed._checked.clear()
    return cache, root


def _edit(root):
    (root / "vllm" / "__init__.py").write_text("X = 2\n")


def _same_size_edit(root):
    (root / "vllm" / "sub" / "m.py").write_text("Y = 3\n")


def _same_size_edit_mtime_kept(root):
    """The seal skips hashing a file whose stamp (inode, ctime, size) is unchanged: an edit that keeps
    size and mtime must still be caught (the kernel moves ctime; nobody can set it back)."""
    path = root / "vllm" / "sub" / "m.py"
    before = os.stat(path)
    path.write_text("Y = 3\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_size == before.st_size


def _added(root):
    (root / "vllm" / "sitecustomize.py").write_text("")


def _added_folder(root):
    (root / "vllm" / "new").mkdir()


def _removed(root):
    (root / "vllm" / "sub" / "m.py").unlink()


def _chmod(root):
    (root / "vllm" / "__init__.py").chmod(0o755)


def _relinked(root):
    (root / "vllm" / "alias.py").unlink()
    (root / "vllm" / "alias.py").symlink_to("/etc/passwd")


def _file_for_link(root):
    (root / "vllm" / "alias.py").unlink()
    (root / "vllm" / "alias.py").write_text("X = 1\n")


def _fifo(root):
    os.mkfifo(root / "vllm" / "pipe")


def _seal_dropped(root):
    marker = root / ".complete"
    marker.write_text(marker.read_text().split("seal ", 1)[0])


def _seal_damaged(root):
    marker = root / ".complete"
    marker.write_text(marker.read_text()[:-20] + "\n")


def _marker_writable(root):
    (root / ".complete").chmod(0o666)


def _folder_writable(root):
    (root / "vllm" / "sub").chmod(0o777)


TAMPER = [
    _edit,
    _same_size_edit,
    _same_size_edit_mtime_kept,
    _added,
    _added_folder,
    _removed,
    _chmod,
    _relinked,
    _file_for_link,
    _fifo,
    _seal_dropped,
    _seal_damaged,
    _marker_writable,
    _folder_writable,
]


@pytest.mark.parametrize("tamper", TAMPER, ids=[t.__name__.strip("_") for t in TAMPER])
def test_a_tree_not_as_built_is_not_used(tmp_path, tamper):
    cache, root = _built(tmp_path)
    assert sealed.untrusted(cache, root, "format 2\n") is None
    assert os.stat(root / "vllm" / "run.sh").st_mode & 0o777 == 0o755
    tamper(root)
    sealed._checked.clear()
    why = sealed.untrusted(cache, root, "format 2\n")
    assert why and "\n" not in why, why
    said: list[str] = []
    assert not sealed.usable(cache, root, "format 2\n", said.append)
    assert said == [f"rebuilding {root}: {why}"]


@root_only
@pytest.mark.parametrize("who", ["file", "folder", "marker", "root", "link"])
def test_a_tree_another_uid_owns_is_not_used(tmp_path, who):
    cache, root = _built(tmp_path)
    target = {
        "file": root / "vllm" / "__init__.py",
        "folder": root / "vllm" / "sub",
        "marker": root / ".complete",
        "root": root,
        "link": root / "vllm" / "alias.py",
    }[who]
    os.chown(target, SERVICE_UID, SERVICE_UID, follow_symlinks=False)
    why = sealed.untrusted(cache, root, "format 2\n")
    assert why and "4001" in why, why


def test_cached_pristine_gives_only_a_sealed_tree(tmp_path):
    from patchctl.smoke.trees import cached_pristine

    cache, root = _built(tmp_path)
    assert cached_pristine(cache, "vllm-1.0.whl") == root
    _edit(root)
    sealed._checked.clear()
    assert cached_pristine(cache, "vllm-1.0.whl") is None


def test_seal_cost_is_measured(tmp_path, capsys):
    """Not a limit: the number the README and sealed.py quote (hashing a venv-sized folder)."""
    import time

    cache = ArtifactCache(tmp_path / "cache")
    root = cache.env("big")
    for i in range(2000):
        folder = root / f"pkg{i // 50}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"m{i}.py").write_bytes(os.urandom(12_000))
    sealed.seal(root, "x\n")
    sealed._checked.clear()
    start = time.monotonic()
    assert sealed.untrusted(cache, root, "x\n") is None  # stamps unchanged: nothing hashed
    stamps = time.monotonic() - start
    start = time.monotonic()
    listing, problem = sealed._listing(root)  # what a copied env (new stamps) costs: every file hashed
    hashed = time.monotonic() - start
    assert problem is None and len(listing) == 2000 + 40
    with capsys.disabled():
        print(f"\nseal check: 2000 files, 24 MB: {stamps:.2f} s by stamps, {hashed:.2f} s hashing every file")
    assert stamps < 10 and hashed < 10


TREE_CHECK = """
def test_patched(patched_tree, pristine_tree):
    assert "ten" in (patched_tree / "vllm/loader.py").read_text()
    assert "ten" not in (pristine_tree / "vllm/loader.py").read_text()
    assert not (patched_tree / "vllm/planted.py").exists() and not (pristine_tree / "vllm/planted.py").exists()
"""


def _untouched(trees_dir: Path) -> None:
    pass


def _patched_edited(trees_dir: Path) -> None:
    (loader,) = trees_dir.glob("*/patched-*/vllm/loader.py")
    loader.write_text(loader.read_text().replace("ten", "TEN"))


def _pristine_edited(trees_dir: Path) -> None:
    (loader,) = trees_dir.glob("*/pristine/vllm/loader.py")
    loader.write_text(loader.read_text() + "# ten\n")


def _planted_in_patched(trees_dir: Path) -> None:
    (folder,) = trees_dir.glob("*/patched-*/vllm")
    (folder / "planted.py").write_text("")


def _pristine_marker_only(trees_dir: Path) -> None:
    (marker,) = trees_dir.glob("*/pristine/.complete")
    marker.write_text(marker.read_text().split("seal ", 1)[0])
    _pristine_edited(trees_dir)


@pytest.mark.parametrize(
    "tamper",
    [_untouched, _patched_edited, _pristine_edited, _planted_in_patched, _pristine_marker_only],
    ids=lambda t: t.__name__.strip("_"),
)
def test_smoke_rebuilds_a_tampered_tree(tmp_path, builder, fresh_cache, tamper):
    """The real `patchctl smoke` twice on a local index; between them the cached trees are changed."""
    import json

    from click.testing import CliRunner
    from support.builders import build_wheel
    from support.fixtures import PRISTINE, loader_with
    from support.index_server import IndexServer

    from patchctl.cli.main import main

    files = tmp_path / "files"
    files.mkdir()
    wheel = build_wheel(files, "vllm", "1.0", PRISTINE)
    good = builder.add(
        "vllm", "good", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})}
    )
    (good / "checks").mkdir()
    (good / "checks" / "test_good.py").write_text(TREE_CHECK)
    with IndexServer(files) as server:
        server.add("vllm", wheel)
        args = [
            "smoke",
            "vllm@1.0",
            "--index-url",
            server.url,
            "--store",
            str(builder.root),
            "--python",
            sys.executable,
            "--json",
        ]
        first = CliRunner().invoke(main, args, catch_exceptions=False)
        assert first.exit_code == 0, first.stdout
        tamper(fresh_cache / "trees")
        sealed._checked.clear()
        second = CliRunner().invoke(main, args, catch_exceptions=False)
    (result,) = json.loads(second.stdout)["results"]
    assert second.exit_code == 0 and result["status"] == "passed", result
    said = [line for line in second.stderr.splitlines() if "rebuilding" in line]
    assert len(said) == (0 if tamper is _untouched else 1), second.stderr


HANGING_CHECK = """
import subprocess, time

def test_hangs(patched_tree):
    child = subprocess.Popen(["sh", "-c", {script!r}])
    open({pids!r}, "w").write(str(child.pid))
    time.sleep(1000)
"""
CHILDREN = {
    "sleeps": "exec sleep 1000",
    "ignores SIGTERM": "trap '' TERM; while :; do sleep 1; done",
    "leaves a grandchild": "sleep 1000 & wait",
    "holds pytest's stdout": "exec sleep 1000 >&1",
    "spins": "while :; do :; done",
}
DEADLINE = 12  # pytest's start on a loaded machine takes seconds: the check must be running by then


@pytest.mark.parametrize("child", sorted(CHILDREN))
def test_a_hanging_check_is_stopped_with_its_children(tmp_path, builder, child):
    """pytest in its own process group: at the deadline the whole group goes, what the check
    started included (subprocess.run's timeout killed pytest alone)."""
    import time

    from support.fixtures import PRISTINE

    from patchctl.smoke.pytest_run import run_checks
    from patchctl.store.layered import Store

    pids = tmp_path / "pids"
    patch_dir = builder.add("vllm", "hang", variants={"1.0": builder.variant(PRISTINE, {"vllm/utils.py": "X = 1\n"})})
    (patch_dir / "checks").mkdir()
    (patch_dir / "checks" / "test_hang.py").write_text(HANGING_CHECK.format(script=CHILDREN[child], pids=str(pids)))
    patch = Store.open(builder.root).series("vllm").get("hang")
    start = time.monotonic()
    result = run_checks(
        patch, "cpu", sys.executable, engine="vllm", version="1.0", patched=tmp_path, pristine=tmp_path, timeout=DEADLINE
    )
    assert result.status == "error" and result.reason == f"timed out after {DEADLINE} s", result
    assert time.monotonic() - start < DEADLINE + 5
    time.sleep(0.2)
    leader = int(pids.read_text())
    group = os.getpgid(leader) if Path(f"/proc/{leader}").exists() else None
    alive = (
        [
            p
            for p in os.listdir("/proc")
            if p.isdigit() and Path(f"/proc/{p}/stat").exists() and _pgid_state(int(p)) == (group, "alive")
        ]
        if group
        else []
    )
    state = _pgid_state(leader)[1]
    assert state in ("gone", "zombie") and not alive, (state, alive)


def _pgid_state(pid: int) -> tuple[int | None, str]:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None, "gone"
    return int(fields[2]), ("zombie" if fields[0] == "Z" else "alive")
