""" "Verified" means verified on every read (issue 33, item 3): what the download cache holds under
`verified/` and its index pages are written by whoever shares the cache, so neither a sha256 stored
beside a member's bytes nor an index page's ETag proves anything by itself.

Three channels, each against the local test index (support.index_server), each case planted
the way an attacker could (this suite runs as root, so "another user" is an os.chown):
- a planted member (or artifact, or RECORD) under verified/<sha256>/, read through other index URLs;
- a planted index page (another user's file, or one others may write);
- a poisoned 304: a liar's page carrying the honest index's ETag, kept in the honest URL's cache file.
Each must be refused (offline: exit 3 naming the file) or read again: never the planted bytes, never
`verified: true` over them."""

from __future__ import annotations

import hashlib
import json
import os
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from support.builders import build_wheel, filler_blobs
from support.fixtures import PRISTINE
from support.index_server import IndexServer
from support.invoke import run_json

from patchctl.sources import fetch
from patchctl.sources.cache import ArtifactCache, framed, member_key

# Planted where the patch still applies, so that only the bytes tell: the planted line in an export.
EVIL_LINE = "import os; os.system('touch /tmp/owned')\n"
EVIL_LOADER = PRISTINE["vllm/loader.py"] + EVIL_LINE
LOADER = "vllm/loader.py"
OTHER_UIDS = (1, 4242, 65534)


def run(server: IndexServer, store: Path, *args: str, expect: int | None = 0) -> dict:
    fetch._index.cache_clear()  # one index client per process: each run reads its own
    return run_json(*args, "--index-url", server.url, "--store", str(store), "--verify", expect=expect)


def check(server: IndexServer, store: Path, *extra: str, expect: int | None = 0) -> dict:
    return run(server, store, "check", "vllm@1.0", *extra, expect=expect)


def assert_honest(doc: dict, honest_sha: str) -> None:
    assert doc["source"]["sha256"] == honest_sha
    assert doc["patches"][0]["outcome"] == "clean", doc["patches"][0]


# (a) members and artifacts under verified/ ---------------------------------------------------------


@pytest.fixture
def wheels(tmp_path):
    """Three index URLs serving the same wheel (verified/ is shared by every URL), and an evil wheel
    (the same files, loader.py with the planted line) whose members and RECORD a planter can copy."""
    honest, evil = tmp_path / "honest", tmp_path / "evil"
    honest.mkdir()
    evil.mkdir()
    # Over release.VERIFY_MARK_BYTES (8 MiB): the artifact gets the stat mark a planter could rewrite.
    filler = filler_blobs(60)
    wheel = build_wheel(honest, "vllm", "1.0", dict(PRISTINE, **filler))
    # A little smaller than the honest one, so that only its sha256 can refuse it (not the size the
    # index lists, which a whole artifact may not exceed).
    smaller = dict(filler, **{"vllm/filler/blob0.bin": filler["vllm/filler/blob0.bin"][:-4000]})
    bad = build_wheel(evil, "vllm", "1.0", dict(PRISTINE, **smaller, **{LOADER: EVIL_LOADER}))
    assert bad.stat().st_size < wheel.stat().st_size
    return wheel, bad


def verified_dir(cache: Path, wheel: Path) -> Path:
    return ArtifactCache(cache).verified(hashlib.sha256(wheel.read_bytes()).hexdigest())


def member(folder: Path, path: str = LOADER) -> Path:
    return folder / "members" / member_key(path)


def _record_of(wheel: Path) -> bytes:
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        return zf.read("vllm-1.0.dist-info/RECORD")


def edit_in_place(folder: Path, evil: Path) -> None:
    """The sweep's case: the member's bytes edited, its own sha256 header rewritten to match."""
    path = member(folder)
    with open(path, "r+b") as f:  # the same inode, the same owner
        f.truncate(0)
        f.write(framed(EVIL_LOADER.encode()))


def another_users_member(uid: int) -> Callable[[Path, Path], None]:
    def plant(folder: Path, evil: Path) -> None:
        path = member(folder)
        path.unlink()
        path.write_bytes(framed(EVIL_LOADER.encode()))
        os.chown(path, uid, uid)

    plant.__name__ = f"member_of_uid_{uid}"
    return plant


def absent_planted(folder: Path, evil: Path) -> None:
    """loader.py said to be missing from the wheel: the patch would be `obsolete`, never checked."""
    member(folder).unlink()
    member(folder).with_suffix(".absent").write_bytes(b"")


def record_and_member_of_another_user(folder: Path, evil: Path) -> None:
    """RECORD rewritten to vouch for the planted member (the evil wheel's own, bound to this folder)."""
    record = folder / "RECORD"
    record.unlink(missing_ok=True)
    record.write_bytes(framed(folder.name.encode() + b"\n" + _record_of(evil)))
    os.chown(record, 4242, 4242)
    another_users_member(4242)(folder, evil)


def record_of_another_artifact(folder: Path, evil: Path) -> None:
    """A RECORD this user wrote, for another artifact (the evil wheel's verified folder), moved here."""
    record = folder / "RECORD"
    record.write_bytes(framed(verified_dir(folder.parent.parent, evil).name.encode() + b"\n" + _record_of(evil)))
    edit_in_place(folder, evil)


def world_writable_record(folder: Path, evil: Path) -> None:
    record = folder / "RECORD"
    record.write_bytes(framed(folder.name.encode() + b"\n" + _record_of(evil)))
    os.chmod(record, 0o666)
    edit_in_place(folder, evil)


def artifact_of_another_user(folder: Path, evil: Path) -> None:
    """The whole artifact swapped for the evil wheel, its stat mark rewritten to match, the members
    gone: the next read takes them from the artifact."""
    artifact = folder / "artifact"
    artifact.unlink()
    artifact.write_bytes(evil.read_bytes())
    os.chown(artifact, 4242, 4242)
    st = os.stat(artifact)
    sha = folder.name
    mark = folder / "artifact.verified"
    mark.unlink(missing_ok=True)
    mark.write_text(f"{st.st_size} {st.st_mtime_ns} {st.st_ino} {sha}")
    for m in (folder / "members").iterdir():
        m.unlink()


PLANTS = [
    edit_in_place,
    *(another_users_member(u) for u in OTHER_UIDS),
    absent_planted,
    record_and_member_of_another_user,
    record_of_another_artifact,
    world_writable_record,
    artifact_of_another_user,
]


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p.__name__)
def test_a_planted_verified_entry_is_never_served(plant, wheels, store, fresh_cache, tmp_path):
    wheel, evil = wheels
    honest_sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    servers = [IndexServer(wheel.parent) for _ in range(3)]
    for server in servers:
        server.add("vllm", wheel)
    with servers[0], servers[1], servers[2]:
        first = check(servers[0], store)
        assert first["source"]["verified"] is True
        folder = verified_dir(fresh_cache, wheel)
        plant(folder, evil)
        doc = check(servers[1], store)  # another URL, the same verified/ folder
        assert_honest(doc, honest_sha)
        assert doc["source"]["verified"] is True  # bytes read again from the proven artifact
        assert EVIL_LINE not in member(folder).read_bytes().decode()
        out = tmp_path / "export"
        exported = run(servers[2], store, "export", "vllm@1.0", str(out))
        assert exported["source"]["verified"] is True
        text = (out / LOADER).read_text()
        assert EVIL_LINE not in text and "ten\n" in text


@pytest.mark.parametrize("plant", [edit_in_place, another_users_member(4242), absent_planted], ids=lambda p: p.__name__)
def test_a_planted_member_is_read_again_and_the_document_says_so(plant, wheels, store, fresh_cache):
    wheel, evil = wheels
    with IndexServer(wheel.parent) as server:
        server.add("vllm", wheel)
        check(server, store)
        folder = verified_dir(fresh_cache, wheel)
        plant(folder, evil)
        doc = check(server, store)
    said = doc["source"].get("refetched", [])
    assert said and str(member(folder)) in said[0] and "RECORD" in said[0]
    assert said[0] in doc["warnings"]


@pytest.mark.parametrize(
    "plant", [edit_in_place, *(another_users_member(u) for u in OTHER_UIDS), absent_planted], ids=lambda p: p.__name__
)
def test_a_planted_member_offline_is_a_named_error(plant, wheels, store, fresh_cache):
    wheel, evil = wheels
    with IndexServer(wheel.parent) as server:
        server.add("vllm", wheel)
        check(server, store)
        folder = verified_dir(fresh_cache, wheel)
        plant(folder, evil)
        doc = check(server, store, "--offline", expect=3)
    planted = member(folder).with_suffix(".absent") if plant is absent_planted else member(folder)
    assert str(planted) in doc["error"]["message"]
    assert "RECORD" in doc["error"]["message"]


def test_a_planted_artifact_offline_is_a_named_error(wheels, store, fresh_cache):
    wheel, evil = wheels
    with IndexServer(wheel.parent) as server:
        server.add("vllm", wheel)
        check(server, store)
        folder = verified_dir(fresh_cache, wheel)
        artifact_of_another_user(folder, evil)
        doc = check(server, store, "--offline", expect=3)
    assert str(folder / "artifact") in doc["error"]["message"] and "sha256" in doc["error"]["message"]


# (b) index pages: planted, and the poisoned 304 --------------------------------------------------


@pytest.fixture
def indexes(tmp_path):
    """An honest index and a liar (an evil wheel under the same name, its own true sha256)."""
    honest_files, lying_files = tmp_path / "honest", tmp_path / "lying"
    honest_files.mkdir()
    lying_files.mkdir()
    real = build_wheel(honest_files, "vllm", "1.0", PRISTINE)
    evil = build_wheel(lying_files, "vllm", "1.0", dict(PRISTINE, **{LOADER: EVIL_LOADER}))
    with IndexServer(honest_files) as honest, IndexServer(lying_files) as liar:
        honest.add("vllm", real)
        liar.add("vllm", evil)
        yield honest, liar, hashlib.sha256(real.read_bytes()).hexdigest()


def page_file(cache: Path, server: IndexServer) -> Path:
    return ArtifactCache(cache).index_page(server.url, "vllm")


def honest_etag(server: IndexServer) -> str:
    with urllib.request.urlopen(f"{server.url}/vllm/") as answer:  # noqa: S310 (127.0.0.1)
        return answer.headers["ETag"]


def liars_page_under_honest_name(honest: IndexServer, liar: IndexServer, store: Path, cache: Path) -> Path:
    """Run against the liar (its evil wheel lands in verified/<its sha>/), then its page, given the
    honest index's ETag, takes the honest URL's cache file (a shared cache, a file-name collision)."""
    check(liar, store, expect=None)
    data = json.loads(page_file(cache, liar).read_bytes())
    data["etag"] = honest_etag(honest)
    target = page_file(cache, honest)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data))
    honest.answers.clear()  # (honest_etag's own GET)
    return target


def page_answers(server: IndexServer) -> list[int]:
    return [status for path, status in server.answers if path == "/simple/vllm/"]


def _with_url(data: dict, page: str) -> dict:
    """The page as a planter writes it for the patchctl that reads it: with its URL recorded where
    the cache's schema has one (a patchctl before it refuses a page that carries one as damaged)."""
    from patchctl.core.schemas import schema

    if "url" in schema("index-cache")["properties"]:
        data["url"] = page
    return data


def _foreign(uid: int) -> Callable[[Path, dict, str], None]:
    def make(path: Path, data: dict, page: str) -> None:
        path.write_text(json.dumps(_with_url(data, page)))  # everything right but its owner
        os.chown(path, uid, uid)

    make.__name__ = f"owned_by_uid_{uid}"
    return make


def _writable(mode: int) -> Callable[[Path, dict, str], None]:
    def make(path: Path, data: dict, page: str) -> None:
        path.write_text(json.dumps(_with_url(data, page)))
        os.chmod(path, mode)

    make.__name__ = f"mode_{mode:o}"
    return make


def _from_url(url: str | None) -> Callable[[Path, dict, str], None]:
    def make(path: Path, data: dict, page: str) -> None:
        data.pop("url", None)
        if url is not None:
            data["url"] = url
        path.write_text(json.dumps(data))

    make.__name__ = f"from_url_{url}"
    return make


PLANTED_PAGES = [*(_foreign(u) for u in OTHER_UIDS), _writable(0o664), _writable(0o646)]
POISONED_PAGES = [
    _from_url(None),
    _from_url("http://127.0.0.1:1/simple/vllm/"),
    _from_url("http://127.0.0.1/simple/vllm/"),
    _from_url("https://mirror.invalid/simple/vllm/"),
    _from_url(""),
]


@pytest.mark.parametrize("forge", PLANTED_PAGES + POISONED_PAGES, ids=lambda f: f.__name__)
def test_a_page_not_proven_ours_is_read_again_whole(forge, indexes, store, fresh_cache):
    honest, liar, honest_sha = indexes
    target = liars_page_under_honest_name(honest, liar, store, fresh_cache)
    forge(target, json.loads(target.read_bytes()), f"{honest.url}/vllm/")
    doc = check(honest, store)
    assert page_answers(honest) == [200]  # no If-None-Match sent: no 304 to keep the liar's page
    assert_honest(doc, honest_sha)
    assert doc["source"]["verified"] is True


def test_a_page_this_user_wrote_from_this_url_is_still_revalidated(indexes, store, fresh_cache):
    """The counterpart: validators of a page proven ours are sent, and the 304 keeps it."""
    honest, _liar, honest_sha = indexes
    check(honest, store)
    doc = check(honest, store)
    assert page_answers(honest) == [200, 304]
    assert_honest(doc, honest_sha)


@pytest.mark.parametrize("forge", PLANTED_PAGES[:3] + POISONED_PAGES[:2], ids=lambda f: f.__name__)
def test_a_fresh_page_not_proven_ours_is_not_used_unasked(forge, indexes, store, fresh_cache, monkeypatch):
    honest, liar, honest_sha = indexes
    monkeypatch.setenv("PATCHCTL_INDEX_MAX_AGE", "3600")
    target = liars_page_under_honest_name(honest, liar, store, fresh_cache)
    data = json.loads(target.read_bytes())
    data["fetched_at"] = time.time()
    forge(target, data, f"{honest.url}/vllm/")
    doc = check(honest, store)
    assert page_answers(honest) == [200]
    assert_honest(doc, honest_sha)


@pytest.mark.parametrize("forge", PLANTED_PAGES[:2] + POISONED_PAGES[:3], ids=lambda f: f.__name__)
def test_a_page_not_proven_ours_offline_is_a_named_error(forge, indexes, store, fresh_cache):
    honest, liar, _ = indexes
    target = liars_page_under_honest_name(honest, liar, store, fresh_cache)
    forge(target, json.loads(target.read_bytes()), f"{honest.url}/vllm/")
    doc = check(honest, store, "--offline", expect=3)
    assert str(target) in doc["error"]["message"]


def test_an_artifact_is_hashed_again_unless_this_user_wrote_it_and_its_mark_holds(wheels, store, fresh_cache, monkeypatch):
    """The mark (size, mtime, inode when it was hashed) spares this user's own artifact a second
    hash; another user's file, which they may rewrite at will, is hashed on every read."""
    from patchctl.sources import release

    wheel, _evil = wheels
    hashed = []
    real = release.hashlib.sha256

    def counting(*data):
        if not data:  # the streaming hash of a whole artifact (members are hashed with their bytes)
            hashed.append(1)
        return real(*data)

    monkeypatch.setattr(release.hashlib, "sha256", counting)
    with IndexServer(wheel.parent) as server:
        server.add("vllm", wheel)
        check(server, store)
        folder = verified_dir(fresh_cache, wheel)
        assert (folder / "artifact.verified").is_file()
        for owner, expected in ((0, 0), (4242, 1), (65534, 1)):
            for m in (folder / "members").iterdir():
                m.unlink()  # so that the members are taken from the artifact again
            os.chown(folder / "artifact", owner, owner)
            hashed.clear()
            server.requests.clear()
            doc = check(server, store)
            assert_honest(doc, folder.name)
            assert len(hashed) == expected, owner
            assert not [p for p, _ in server.requests if p.startswith("/files/")]  # not fetched again


def _symlink(path: Path, tmp: Path) -> None:
    outside = tmp / "outside"
    outside.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(outside)


def _fifo(path: Path, tmp: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _folder(path: Path, tmp: Path) -> None:
    path.unlink()
    path.mkdir()


def _huge(path: Path, tmp: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(100 << 20)  # sparse: no disk used


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["RECORD", "artifact.verified"])
@pytest.mark.parametrize("kind", [_symlink, _fifo, _folder, _huge], ids=lambda k: k.__name__.strip("_"))
def test_the_files_that_prove_are_read_as_every_cache_file_is(name, kind, wheels, store, fresh_cache, tmp_path):
    """RECORD and the artifact's mark are cache files like any other: a link is not followed, a FIFO
    does not hang, a folder or a huge file is refused, and the entry is read again (no traceback)."""
    wheel, _evil = wheels
    with IndexServer(wheel.parent) as server:
        server.add("vllm", wheel)
        check(server, store)
        folder = verified_dir(fresh_cache, wheel)
        kind(folder / name, tmp_path)
        if name == "artifact.verified":
            for m in (folder / "members").iterdir():
                m.unlink()  # so that the artifact, and its mark, are read
        doc = check(server, store)
        assert_honest(doc, folder.name)
        assert doc["source"]["verified"] is True
        offline = check(server, store, "--offline", expect=None)
    assert offline["exit_code"] in (0, 3), offline
    if offline["exit_code"] == 0:
        assert_honest(offline, folder.name)
