"""`apply --install` as root on a venv another user owns: the installer starts that venv's
interpreter (pip from its site-packages, its `.pth` files at start-up), whose code the venv's owner
wrote. It runs as the owner, never as root (issue 33, item 1)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from patchctl.tree import find

SYSTEM_PYTHON = "/usr/bin/python3"
OWNER = 4001

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="giving a venv to another uid needs root"),
    pytest.mark.skipif(
        not os.access(SYSTEM_PYTHON, os.X_OK),
        reason=f"a venv another uid can run needs an interpreter outside /root ({SYSTEM_PYTHON})",
    ),
]


@pytest.fixture
def service_venv():
    """A venv owned by uid 4001 whose site-packages holds a `.pth` that writes the uid it runs as
    (under /tmp: pytest's own folders are root's 0700, which the owner could not reach)."""
    top = Path(tempfile.mkdtemp(prefix="patchctl-venv-", dir="/tmp"))
    top.chmod(0o755)
    venv = top / "venv"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "owner.pth").write_text(f"import os; open({str(venv / 'ran-as')!r}, 'a').write(f'{{os.geteuid()}}\\n')\n")
    for folder, dirs, files in os.walk(venv):
        for name in [*dirs, *files]:
            os.chown(os.path.join(folder, name), OWNER, OWNER, follow_symlinks=False)
    os.chown(venv, OWNER, OWNER)
    yield venv
    shutil.rmtree(top)


def test_the_installer_user_is_the_venvs_owner(service_venv):
    assert find.installer_user(str(service_venv / "bin/python")) == (OWNER, OWNER)


@pytest.mark.parametrize(
    "args",
    [
        ["-c", "pass"],
        ["-c", "import sys; sys.exit(0)"],
        ["-S", "-c", "import site; site.main()"],
        ["-m", "site"],
        ["-c", "import json"],
    ],
)
def test_the_installer_runs_as_the_venvs_owner(service_venv, args, capsys):
    python = str(service_venv / "bin/python")
    find._run_installer([python, *args], "pip", find.installer_user(python))
    ran = (service_venv / "ran-as").read_text().split()
    assert ran and set(ran) == {str(OWNER)}, f"the venv's .pth ran as {ran}"
    assert f"running pip as uid {OWNER}" in capsys.readouterr().err


def test_a_failing_installer_as_the_owner_is_exit_3(service_venv):
    from patchctl.core.errors import EnvironmentProblem

    python = str(service_venv / "bin/python")
    with pytest.raises(EnvironmentProblem) as caught:
        find._run_installer([python, "-c", "raise SystemExit(5)"], "pip", find.installer_user(python))
    assert "exit code 5" in caught.value.message


def test_a_root_venv_installs_as_root(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    assert find.installer_user(str(venv / "bin/python")) is None
