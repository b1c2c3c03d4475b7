"""The bench_serving fixtures are shared by the four bench patches: checklib/sglang/bench_fixtures.py."""

from checklib.sglang.bench_fixtures import reasoning_server  # noqa: F401 (a fixture)
