"""nofollow's walk of a tree path (the `*_beneath` functions): links the tree holds are followed
while they stay inside it (relative, absolute, through `..`, chained), one that leads out anywhere
on the path is refused by name, a loop is refused, a FIFO is refused without blocking, and a
missing file, a folder or a path under a file is None."""

import os

import pytest

from patchctl.core.errors import Planted
from patchctl.core.nofollow import lstat_beneath, parent_beneath, read_beneath


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "root"
    (root / "a/b").mkdir(parents=True)
    (root / "a/b/f").write_text("hi\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out/s").write_text("secret\n")
    links = {
        "a/rel": "../a/b/f",
        "abs": str(root / "a/b/f"),
        "a/dirlink": "b/../../a/b",
        "a/b/side": "../../a/b",
        "a/bad": str(tmp_path / "out/s"),
        "a/b/up": "../../../out",
        "slash": "/",
        "loop": "loop",
        "a/dotdot": "..",
        "a/b/rootlink": "../..",
    }
    for rel, to in links.items():
        (root / rel).symlink_to(to)
    os.mkfifo(root / "a/fifo")
    return root


@pytest.mark.parametrize(
    "rel", ["a/b/f", "a/rel", "abs", "a/dirlink/f", "a/b/side/f", "a/b/side/side/side/f", "a/dotdot/a/b/f", "a/b/rootlink/a/b/f"]
)
def test_links_inside_the_tree_are_followed(root, rel):
    assert read_beneath(root, rel) == b"hi\n"


@pytest.mark.parametrize("rel", ["a/bad", "a/b/up/s", "slash/etc/passwd", "a/b/side/up/s", "a/b/rootlink/../x"])
def test_a_link_out_of_the_tree_anywhere_on_the_path_is_refused(root, rel):
    with pytest.raises(Planted, match="outside the tree"):
        read_beneath(root, rel)


def test_a_loop_is_refused(root):
    with pytest.raises(Planted, match="symlinks on the way"):
        read_beneath(root, "loop")


def test_a_fifo_is_refused_without_blocking(root):
    with pytest.raises(Planted, match="not a regular file"):
        read_beneath(root, "a/fifo")


@pytest.mark.parametrize("rel", ["missing", "a/missing/x", "a/b/f/x", "a/b", "a/dotdot"])
def test_missing_a_folder_or_under_a_file_is_none(root, rel):
    assert read_beneath(root, rel) is None


def test_the_last_name_is_never_followed_for_a_write(root, tmp_path):
    with parent_beneath(root, "a/bad") as (folder, name):
        assert name == "bad" and os.readlink(name, dir_fd=folder) == str(tmp_path / "out/s")
    assert lstat_beneath(root, "a/bad").st_mode & 0o170000 == 0o120000  # the link itself
    with pytest.raises(Planted, match="outside the tree"):
        with parent_beneath(root, "a/b/up/new.py", create=True):
            pass
    assert not (tmp_path / "out/new.py").exists()
