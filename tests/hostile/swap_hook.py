"""Run the patchctl CLI with a hook at the seam between a tree path's check and its use: the Nth
time `Place.inside` (the bookkeeping's) has checked HOSTILE_SWAP's `rel` (resolved it inside the tree), the name
is swapped for a link out of the tree before the caller goes on to read or write it, as the tree's
owner racing a root `patchctl` could. The `inside` method exists before and after the fix, so the
same hook runs against either. A marker file says that the swap happened."""

import json
import os
import sys
from pathlib import Path

from patchctl.tree.bookkeeping import place

SPEC = json.loads(os.environ["HOSTILE_SWAP"])
_inside = place.Place.inside
_calls = [0]


def _swap() -> None:
    site, outside, what = Path(SPEC["site"]), Path(SPEC["outside"]), SPEC["what"]
    if what == "file":  # the final name: a link to a file outside
        name = site / SPEC["rel"]
        os.rename(name, name.with_name(".moved-away"))
        name.symlink_to(outside / "patched.py")
    elif what == "pycache":  # the module's bytecode folder: a link to a folder outside
        cache = site / SPEC["rel"].rsplit("/", 1)[0] / "__pycache__"
        os.rename(cache, cache.with_name(".moved-cache"))
        cache.symlink_to(outside / "pycache")
    elif what == "folder":  # the package folder the file lies in: a link to a folder outside
        folder = site / SPEC["rel"].rsplit("/", 1)[0]
        os.rename(folder, site / ".moved-package")
        folder.symlink_to(outside / "package")
    Path(SPEC["marker"]).write_text("swapped\n")


def inside(self, rel, where):
    out = _inside(self, rel, where)
    if rel == SPEC["rel"]:
        _calls[0] += 1
        if _calls[0] == SPEC["at"]:
            _swap()
    return out


place.Place.inside = inside

if __name__ == "__main__":
    from patchctl.cli.main import main

    sys.argv = ["patchctl", *sys.argv[1:]]
    main()
