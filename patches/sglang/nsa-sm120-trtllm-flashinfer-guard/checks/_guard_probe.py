"""Resolve SGLang's NSA/DSA backends, start-up guard included, for a list of scenarios.

Run as a subprocess (one release tree per process): `python _guard_probe.py <tree> <scenarios.json>`.
Prints one JSON list to stdout, last line: per scenario {"guarded": R, "unguarded": R}, R =
{"prefill", "decode", "error", "error_type", "flag_prefix"}; "unguarded" is the same scenario with
SGLANG_SKIP_SM120_TRTLLM_CHECK=1 (what the release resolves when the guard, if any, stands aside).

Each scenario: {"capability": [12, 0], "kv_cache_dtype": "fp8_e4m3", "prefill": null,
"decode": null, "arch": "GlmMoeDsaForCausalLM", "flashinfer_root": "/tmp/.../stock" or null,
"env": {...}}. `prefill`/`decode` are what the user passed (null = not set). `flashinfer_root` is
put first on sys.path so that `importlib.util.find_spec("flashinfer")` finds the fake package
there (FlashInfer is never imported: the probe refuses to go on if it was).

The device capability is stubbed where upstream reads it (see the nsa-sm120-trtllm-default
checks): 0.5.9-0.5.14 pass `major` to `ServerArgs._set_default_{nsa,dsa}_backends`, which the
server calls from `__post_init__` (via `_handle_model_specific_adjustments`); 0.5.15+ run
`arg_groups.overrides._dsa_split_backend_resolution(view)`, the pass that `__post_init__` invokes
at the same slot, which calls torch.cuda.get_device_capability() itself.
"""
import dataclasses
import importlib
import json
import os
import pathlib
import sys
import types


def main() -> None:
    tree, scenarios_path = sys.argv[1], sys.argv[2]
    sys.path.insert(0, tree)
    # shared with the bench patches' checks
    sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[3] / "checklib" / "sglang"))
    import _sglang_cpu_stubs

    _sglang_cpu_stubs.install()
    import torch

    with open(scenarios_path) as f:
        scenarios = json.load(f)

    from sglang.srt import server_args as sa

    out = []
    for sc in scenarios:
        if any(m == "flashinfer" or m.startswith("flashinfer.") for m in sys.modules):
            bad = _err(RuntimeError("flashinfer was imported; fake roots cannot be swapped"))
            out.append({"guarded": bad, "unguarded": bad})
            continue
        out.append(
            {
                "guarded": _run(sa, torch, sc, sc.get("env") or {}),
                "unguarded": _run(sa, torch, sc, {"SGLANG_SKIP_SM120_TRTLLM_CHECK": "1"}),
            }
        )
    print(json.dumps(out))


def _run(sa, torch, sc, env):
    root = sc.get("flashinfer_root")
    saved_env = dict(os.environ)
    os.environ.pop("SGLANG_SKIP_SM120_TRTLLM_CHECK", None)
    os.environ.update(env)
    if root:
        sys.path.insert(0, root)
    importlib.invalidate_caches()
    try:
        return _resolve(sa, torch, sc)
    except Exception as e:  # reported, the check decides
        return _err(e)
    finally:
        if root:
            sys.path.remove(root)
        os.environ.clear()
        os.environ.update(saved_env)


def _err(e):
    return {
        "prefill": None,
        "decode": None,
        "error": f"{type(e).__name__}: {e}",
        "error_type": type(e).__name__,
    }


def _blank_server_args(sa):
    cls = sa.ServerArgs
    obj = cls.__new__(cls)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            value = f.default_factory()  # type: ignore[misc]
        else:
            value = None
        object.__setattr__(obj, f.name, value)
    return obj


def _resolve(sa, torch, sc):
    major = int(sc["capability"][0])
    cap = tuple(sc["capability"])
    torch.cuda.get_device_capability = lambda device=None: cap
    cls = sa.ServerArgs
    try:
        from sglang.srt.arg_groups import overrides
    except ImportError:
        overrides = None
    if overrides is None or not hasattr(overrides, "_dsa_split_backend_resolution"):
        prefix = "nsa" if hasattr(cls, "_set_default_nsa_backends") else "dsa"
        obj = _blank_server_args(sa)
        object.__setattr__(obj, "kv_cache_dtype", sc["kv_cache_dtype"])
        object.__setattr__(obj, f"{prefix}_prefill_backend", sc.get("prefill"))
        object.__setattr__(obj, f"{prefix}_decode_backend", sc.get("decode"))
        if hasattr(obj, "enable_hisparse"):
            object.__setattr__(obj, "enable_hisparse", False)
        getattr(obj, f"_set_default_{prefix}_backends")(sc["kv_cache_dtype"], major)
        return {
            "prefill": getattr(obj, f"{prefix}_prefill_backend"),
            "decode": getattr(obj, f"{prefix}_decode_backend"),
            "error": None,
            "error_type": None,
            "flag_prefix": f"--{prefix}",
        }
    from transformers import PretrainedConfig

    hf_config = PretrainedConfig(architectures=[sc["arch"]], index_topk=2048)
    model_config = types.SimpleNamespace(hf_config=hf_config, hf_text_config=hf_config)
    view = _blank_server_args(sa)
    for name, value in (
        ("kv_cache_dtype", sc["kv_cache_dtype"]),
        ("dsa_prefill_backend", sc.get("prefill")),
        ("dsa_decode_backend", sc.get("decode")),
        ("enable_hisparse", False),
        ("get_model_config", lambda: model_config),
    ):
        object.__setattr__(view, name, value)
    declared = overrides._dsa_split_backend_resolution(view)
    return {
        "prefill": declared.get("dsa_prefill_backend", view.dsa_prefill_backend),
        "decode": declared.get("dsa_decode_backend", view.dsa_decode_backend),
        "error": None,
        "error_type": None,
        "flag_prefix": "--dsa",
    }


if __name__ == "__main__":
    main()
