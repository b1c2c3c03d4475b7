"""Resolve SGLang's NSA/DSA prefill/decode backends the way a release does at start-up,
with the device capability stubbed; shared by the checks of the NSA default and guard patches.

Where upstream decides (the probes' docstrings say more):
- 0.5.9-0.5.14: `ServerArgs._set_default_{nsa,dsa}_backends(kv_cache_dtype, major)` receives the
  major that `_handle_model_specific_adjustments` read from torch.cuda.get_device_capability();
- 0.5.15+: `arg_groups.overrides._dsa_split_backend_resolution(view)` calls
  torch.cuda.get_device_capability() itself, so that function is replaced on torch.cuda; the model
  config is handed over as `view.get_model_config()` (0.5.15-0.5.19) and as the memoized
  `_model_config` that `model_config_of(view)` returns (0.5.20+, where ServerArgs is assembled from
  argument groups and the view is a permissive namespace). A scenario's `kv_cache_dtype: "auto"`
  first goes through `_dsa_kv_cache_dtype_default` (the pass `__post_init__` runs just before),
  which turns it into the dtype the release defaults to (fp8_e4m3 on major >= 10).

Also what the probe scripts share (opening a release on CPU, the error record, reporting) and what
the checks' conftests share (the scenario record, running a probe over a list of scenarios through
checklib.probe).
"""

import dataclasses
import json
import pathlib
import sys
import types

from checklib import probe
from checklib.stubs import stub_missing


def scenario(capability, kv_cache_dtype, prefill, decode, **extra) -> dict:
    """One probe scenario: what the user passed (None = not set) on a GLM-5 (DSA) model."""
    return {
        "capability": list(capability),
        "kv_cache_dtype": kv_cache_dtype,
        "prefill": prefill,
        "decode": decode,
        "arch": "GlmMoeDsaForCausalLM",
        **extra,
    }


def open_release(tree: str, scenarios_path: str):
    """In a probe process: (sglang.srt.server_args of the release at `tree`, importable on a CPU
    machine; torch; the scenarios)."""
    sys.path.insert(0, tree)
    # SGLang imports torchvision at module level (image helpers); PyPI torchvision cannot sit next
    # to the CPU torch build. Nothing the probes exercise calls into it.
    stub_missing("torchvision")
    import torch

    with open(scenarios_path) as f:
        scenarios = json.load(f)
    from sglang.srt import server_args as sa

    return sa, torch, scenarios


def error_result(e: Exception) -> dict:
    """What a probe reports for a scenario the release refused (the check decides)."""
    return {"prefill": None, "decode": None, "error": f"{type(e).__name__}: {e}", "error_type": type(e).__name__}


def blank_server_args(sa):
    """A ServerArgs with every field at its declared default and no __post_init__ run."""
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


class PermissiveView(types.SimpleNamespace):
    """0.5.20+: unknown ServerArgs fields read as unset."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def resolve(sa, torch, sc) -> dict:
    """One scenario ({"capability", "kv_cache_dtype", "prefill", "decode", "arch"}) ->
    {"prefill", "decode", "where", "flag_prefix"}; raises what the release raises."""
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
        obj = blank_server_args(sa)
        object.__setattr__(obj, "kv_cache_dtype", sc["kv_cache_dtype"])
        object.__setattr__(obj, f"{prefix}_prefill_backend", sc.get("prefill"))
        object.__setattr__(obj, f"{prefix}_decode_backend", sc.get("decode"))
        if hasattr(obj, "enable_hisparse"):
            object.__setattr__(obj, "enable_hisparse", False)
        getattr(obj, f"_set_default_{prefix}_backends")(sc["kv_cache_dtype"], major)
        return {
            "prefill": getattr(obj, f"{prefix}_prefill_backend"),
            "decode": getattr(obj, f"{prefix}_decode_backend"),
            "where": f"ServerArgs._set_default_{prefix}_backends",
            "flag_prefix": f"--{prefix}",
        }
    from transformers import PretrainedConfig

    hf_config = PretrainedConfig(architectures=[sc["arch"]], index_topk=2048)
    model_config = types.SimpleNamespace(hf_config=hf_config, hf_text_config=hf_config)
    if dataclasses.is_dataclass(sa.ServerArgs):
        view = blank_server_args(sa)
    else:
        view = PermissiveView(model_path="glm-5-probe", tokenizer_path="glm-5-probe")
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
    if sc["kv_cache_dtype"] == "auto" and hasattr(overrides, "_dsa_kv_cache_dtype_default"):
        # the pass that runs just before the split-backend resolution turns auto into a dtype
        kv = overrides._dsa_kv_cache_dtype_default(view).get("kv_cache_dtype", view.kv_cache_dtype)
        object.__setattr__(view, "kv_cache_dtype", kv)
    declared = overrides._dsa_split_backend_resolution(view)
    return {
        "prefill": declared.get("dsa_prefill_backend", view.dsa_prefill_backend),
        "decode": declared.get("dsa_decode_backend", view.dsa_decode_backend),
        "where": "arg_groups.overrides._dsa_split_backend_resolution",
        "flag_prefix": "--dsa",
        "kv_cache_dtype": view.kv_cache_dtype,
    }


def report(results: list) -> None:
    """In a probe process: the results, one per scenario, in the order of the scenarios."""
    probe.emit({"results": results})


def run_scenarios(script: pathlib.Path, tree: pathlib.Path, payload: list, workdir: pathlib.Path) -> list:
    """Run a probe script against one release tree in a fresh interpreter
    (`python script tree scenarios.json`, checklib.probe); a result per scenario of `payload`."""
    path = workdir / "scenarios.json"
    path.write_text(json.dumps(payload))
    results = probe.run_probe(tree, script, path, timeout=600)["results"]
    assert len(results) == len(payload), (len(results), len(payload))
    return results
