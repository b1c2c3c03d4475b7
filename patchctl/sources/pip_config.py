"""pip's unstable internals, behind one module (as pip-tools does): the index the user configured
for pip, and pip's own default when nothing is configured. patchctl never names an index host."""
from __future__ import annotations

import json
import os
import subprocess
import sys


def configured_index_url() -> tuple[str, str]:
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"], "PIP_INDEX_URL"
    try:
        return _from_pip_in_process()
    except Exception:  # pip missing or its internals moved: ask a pip process instead
        return _from_pip_subprocess()


def _from_pip_in_process() -> tuple[str, str]:
    from pip._internal.configuration import Configuration
    from pip._internal.models.index import PyPI

    configuration = Configuration(isolated=False)
    configuration.load()
    for key in ("install.index-url", "download.index-url", "global.index-url"):
        try:
            return str(configuration.get_value(key)), f"pip config {key}"
        except Exception:
            continue
    return PyPI.simple_url, "pip's default index"


_SCRIPT = """
import json
from pip._internal.configuration import Configuration
from pip._internal.models.index import PyPI
c = Configuration(isolated=False); c.load()
for key in ("install.index-url", "download.index-url", "global.index-url"):
    try:
        print(json.dumps([str(c.get_value(key)), "pip config " + key])); break
    except Exception:
        pass
else:
    print(json.dumps([PyPI.simple_url, "pip's default index"]))
"""


def _from_pip_subprocess() -> tuple[str, str]:
    for python in (sys.executable, "python3"):
        try:
            out = subprocess.run([python, "-c", _SCRIPT], capture_output=True, text=True, timeout=60)
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.strip():
            url, origin = json.loads(out.stdout.strip().splitlines()[-1])
            return url, origin
    from patchctl.errors import EnvironmentProblem

    raise EnvironmentProblem(
        "cannot tell which package index to use: pip is not available",
        hint="pass --index-url or set PIP_INDEX_URL",
    )
