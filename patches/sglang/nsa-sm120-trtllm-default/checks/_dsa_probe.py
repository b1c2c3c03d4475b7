"""Resolve SGLang's NSA/DSA prefill/decode backend defaults for a list of scenarios.

Run as a subprocess (one release tree per process): `python _dsa_probe.py <tree> <scenarios.json>`.
Prints one JSON list of {"prefill", "decode", "error"} to stdout, last line.

Each scenario: {"capability": [12, 0], "kv_cache_dtype": "fp8_e4m3", "prefill": null,
"decode": null, "arch": "GlmMoeDsaForCausalLM"}. `prefill`/`decode` are what the user passed
(null = not set). The device capability is stubbed where upstream reads it: see
patches/checklib/sglang/_nsa_resolution.py, shared with the guard patch's checks.
"""
import json
import pathlib
import sys


def main() -> None:
    tree, scenarios_path = sys.argv[1], sys.argv[2]
    sys.path.insert(0, tree)
    # shared with the bench patches' checks
    sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[3] / "checklib" / "sglang"))
    import _nsa_resolution
    import _sglang_cpu_stubs

    _sglang_cpu_stubs.install()
    import torch

    with open(scenarios_path) as f:
        scenarios = json.load(f)

    from sglang.srt import server_args as sa

    out = []
    for sc in scenarios:
        try:
            r = _nsa_resolution.resolve(sa, torch, sc)
            out.append({"prefill": r["prefill"], "decode": r["decode"], "error": None, "where": r["where"]})
        except Exception as e:  # reported, the check decides
            out.append({"prefill": None, "decode": None, "error": f"{type(e).__name__}: {e}"})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
