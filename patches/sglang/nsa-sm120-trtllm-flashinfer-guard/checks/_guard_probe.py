"""Resolve SGLang's NSA/DSA backends, start-up guard included, for a list of scenarios.

Run as a subprocess (one release tree per process): `python _guard_probe.py <tree> <scenarios.json>`.
Reports (checklib.probe) {"results": [...]}, per scenario {"guarded": R, "unguarded": R}, R =
{"prefill", "decode", "error", "error_type", "flag_prefix"}; "unguarded" is the same scenario with
SGLANG_SKIP_SM120_TRTLLM_CHECK=1 (what the release resolves when the guard, if any, stands aside).

Each scenario: {"capability": [12, 0], "kv_cache_dtype": "fp8_e4m3", "prefill": null,
"decode": null, "arch": "GlmMoeDsaForCausalLM", "flashinfer_root": "/tmp/.../stock" or null,
"env": {...}}. `prefill`/`decode` are what the user passed (null = not set). `flashinfer_root` is
put first on sys.path so that `importlib.util.find_spec("flashinfer")` finds the fake package
there (FlashInfer is never imported: the probe refuses to go on if it was).

The device capability is stubbed where upstream reads it (checklib/sglang/_nsa_resolution.py,
shared with the nsa-sm120-trtllm-default checks): 0.5.9-0.5.14 pass `major`
to `ServerArgs._set_default_{nsa,dsa}_backends`, which the server calls from `__post_init__`
(via `_handle_model_specific_adjustments`); 0.5.15+ run
`arg_groups.overrides._dsa_split_backend_resolution(view)`, the pass that `__post_init__` invokes
at the same slot, which calls torch.cuda.get_device_capability() itself.
"""

import importlib
import os
import sys

from checklib.sglang import _nsa_resolution as nsa  # shared with the default patch's checks


def main() -> None:
    sa, torch, scenarios = nsa.open_release(sys.argv[1], sys.argv[2])
    out = []
    for sc in scenarios:
        if any(m == "flashinfer" or m.startswith("flashinfer.") for m in sys.modules):
            bad = nsa.error_result(RuntimeError("flashinfer was imported; fake roots cannot be swapped"))
            out.append({"guarded": bad, "unguarded": bad})
            continue
        out.append(
            {
                "guarded": _run(sa, torch, sc, sc.get("env") or {}),
                "unguarded": _run(sa, torch, sc, {"SGLANG_SKIP_SM120_TRTLLM_CHECK": "1"}),
            }
        )
    nsa.report(out)


def _run(sa, torch, sc, env):
    root = sc.get("flashinfer_root")
    saved_env = dict(os.environ)
    os.environ.pop("SGLANG_SKIP_SM120_TRTLLM_CHECK", None)
    os.environ.update(env)
    if root:
        sys.path.insert(0, root)
    importlib.invalidate_caches()
    try:
        return dict(nsa.resolve(sa, torch, sc), error=None, error_type=None)
    except Exception as e:  # reported, the check decides
        return nsa.error_result(e)
    finally:
        if root:
            sys.path.remove(root)
        os.environ.clear()
        os.environ.update(saved_env)


if __name__ == "__main__":
    main()
