"""What the SGLang patches' checks share: the bench_serving runner and its fake reasoning-model
server (bench_fixtures, _bench_runner, _fake_reasoning_server) and the NSA/DSA backend resolution
of the two nsa-sm120 patches' probes (_nsa_resolution)."""
