"""Resolve SGLang's NSA/DSA prefill/decode backend defaults for a list of scenarios.

Run as a subprocess (one release tree per process): `python _dsa_probe.py <tree> <scenarios.json>`.
Prints one JSON list of {"prefill", "decode", "error"} to stdout, last line.

Each scenario: {"capability": [12, 0], "kv_cache_dtype": "fp8_e4m3", "prefill": null,
"decode": null, "arch": "GlmMoeDsaForCausalLM"}. `prefill`/`decode` are what the user passed
(null = not set). The device capability is stubbed where upstream reads it:
- 0.5.9-0.5.14: `ServerArgs._set_default_{nsa,dsa}_backends(kv_cache_dtype, major)` receives the
  major that `_handle_model_specific_adjustments` read from torch.cuda.get_device_capability();
- 0.5.15+: `arg_groups.overrides._dsa_split_backend_resolution(view)` calls
  torch.cuda.get_device_capability() itself, so that function is replaced on torch.cuda;
  the model config is handed over as `view.get_model_config()` (0.5.15-0.5.19) and as the
  memoized `_model_config` that `model_config_of(view)` returns (0.5.20+, where ServerArgs is
  assembled from argument groups and the view is a permissive namespace).
"""
import dataclasses
import json
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
        try:
            out.append(_resolve(sa, torch, sc))
        except Exception as e:  # reported, the check decides
            out.append({"prefill": None, "decode": None, "error": f"{type(e).__name__}: {e}"})
    print(json.dumps(out))


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


class _PermissiveView(types.SimpleNamespace):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


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
            "where": f"ServerArgs._set_default_{prefix}_backends",
        }
    from transformers import PretrainedConfig

    hf_config = PretrainedConfig(architectures=[sc["arch"]], index_topk=2048)
    model_config = types.SimpleNamespace(hf_config=hf_config, hf_text_config=hf_config)
    if dataclasses.is_dataclass(sa.ServerArgs):
        view = _blank_server_args(sa)
    else:  # 0.5.20+: ServerArgs is assembled from arg groups; read unknown fields as unset
        view = _PermissiveView(model_path="glm-5-probe", tokenizer_path="glm-5-probe")
    for name, value in (
        ("kv_cache_dtype", sc["kv_cache_dtype"]),
        ("dsa_prefill_backend", sc.get("prefill")),
        ("dsa_decode_backend", sc.get("decode")),
        ("enable_hisparse", False),
        ("get_model_config", lambda: model_config),
        # 0.5.20+: model_config_of(view) hands back the config memoized on the record
        ("_model_config", model_config),
    ):
        object.__setattr__(view, name, value)
    declared = overrides._dsa_split_backend_resolution(view)
    return {
        "prefill": declared.get("dsa_prefill_backend", view.dsa_prefill_backend),
        "decode": declared.get("dsa_decode_backend", view.dsa_decode_backend),
        "error": None,
        "where": "arg_groups.overrides._dsa_split_backend_resolution",
    }


if __name__ == "__main__":
    main()
