"""Helpers shared by the patches' smoke checks (`patches/<engine>/<patch>/checks/`).

Imported as `checklib` (`from checklib.probe import run_probe`): `patchctl smoke` puts it on the
PYTHONPATH of the pytest process it starts (patchctl/smoke/pytest_run.py), and every subprocess a
check starts (probes, the rerun on the pristine tree, the bench runner) inherits it. To run a
check by hand, put the store's folder on the path yourself: `PYTHONPATH=patches python -m pytest
-p patchctl.smoke.pytest_plugin patches/<engine>/<patch>/checks`.

- probe: the probe protocol (a script run against one release tree in a fresh interpreter,
  answering one `PROBE-RESULT {json}` line);
- stubs: the one import-stub finder (stand-ins for modules a CPU smoke environment cannot import);
- pristine: rerunning a checks folder against the pristine release, for a check marked
  `pristine_fails` that requires the patch's own checks to fail there;
- gguf_fixtures: tiny GGUF files written the way llama.cpp's converter writes them;
- sglang: what the SGLang patches' checks share (bench_serving runner and fake server, NSA/DSA
  backend resolution).

Only the standard library and pytest at import time: these modules run inside the smoke
environments, which have neither patchctl's dependencies nor a GPU.
"""
