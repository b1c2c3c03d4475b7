"""The bench_serving fixtures are shared by the four bench patches: patches/checklib/sglang."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "checklib" / "sglang"))
from bench_fixtures import *  # noqa: E402,F401,F403
