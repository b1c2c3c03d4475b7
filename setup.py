"""Only what pyproject.toml cannot say: the bundled patch set (patches/ in the repository) is copied
into the built package as patchctl/bundled/, so a wheel or an sdist installed as a tool carries it.
An editable install reads patches/ from the checkout instead (patchctl/core/bundled.py)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithPatchSet(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        source = HERE / "patches"
        if not source.is_dir():  # building from an sdist: MANIFEST.in put patches/ beside setup.py
            raise SystemExit("patches/ is missing: the patch set is the product, a build without it is refused")
        target = Path(self.build_lib) / "patchctl" / "bundled"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))


setup(cmdclass={"build_py": BuildWithPatchSet})
