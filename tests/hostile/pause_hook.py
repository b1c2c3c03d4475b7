"""Run the patchctl CLI paused right after one system call of its own: the first time the call named
by HOSTILE_PAUSE's `call` (unlink, rmdir, listdir, replace, open) has acted on the path `path` (while
`absent`, when given, does not exist), the hook writes `marker` and waits until `go` exists (at
most 60 s), then lets patchctl go on. A test runs another command in that gap: the exact point of
a race, reached without timing. The calls are the os module's, so the hook runs the same against
any version of patchctl (a dir_fd is turned into its path through /proc/self/fd)."""

import json
import os
import sys
import time

SPEC = json.loads(os.environ["HOSTILE_PAUSE"])
_fired = [False]
_real = {name: getattr(os, name) for name in ("unlink", "rmdir", "listdir", "replace", "open")}


def _where(name, dir_fd):
    if isinstance(name, int):  # listdir(fd)
        return os.readlink(f"/proc/self/fd/{name}")
    name = os.fsdecode(name)
    if dir_fd is None:
        return os.path.abspath(name)
    return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), name)


def _after(call, where):
    if _fired[0] or call != SPEC["call"] or where != SPEC["path"]:
        return
    if SPEC.get("absent") and os.path.lexists(SPEC["absent"]):
        return
    _fired[0] = True
    with open(SPEC["marker"], "w") as f:
        f.write(f"{call} {where}\n")
    deadline = time.monotonic() + 60
    while not os.path.exists(SPEC["go"]) and time.monotonic() < deadline:
        time.sleep(0.02)


def unlink(path, *, dir_fd=None):
    _real["unlink"](path, dir_fd=dir_fd)
    _after("unlink", _where(path, dir_fd))


def rmdir(path, *, dir_fd=None):
    _real["rmdir"](path, dir_fd=dir_fd)
    _after("rmdir", _where(path, dir_fd))


def listdir(path="."):
    out = _real["listdir"](path)
    _after("listdir", _where(path, None))
    return out


def replace(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
    _real["replace"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
    _after("replace", _where(dst, dst_dir_fd))


def open_(path, flags, mode=0o777, *, dir_fd=None):
    fd = _real["open"](path, flags, mode, dir_fd=dir_fd)
    _after("open", _where(path, dir_fd))
    return fd


os.unlink, os.rmdir, os.listdir, os.replace, os.open = unlink, rmdir, listdir, replace, open_

if __name__ == "__main__":
    from patchctl.cli.main import main

    sys.argv = ["patchctl", *sys.argv[1:]]
    main()
