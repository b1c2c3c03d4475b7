"""The bench_serving fixtures are shared by the bench patches: checklib/sglang/bench_fixtures.py."""

from checklib.sglang.bench_fixtures import pinging_server, reasoning_server  # noqa: F401 (fixtures)
