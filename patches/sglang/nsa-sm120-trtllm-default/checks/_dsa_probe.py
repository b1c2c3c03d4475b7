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

# shared with the guard patch's checks (and the bench patches' CPU stubs)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "checklib" / "sglang"))
import _nsa_resolution as nsa  # noqa: E402


def main() -> None:
    sa, torch, scenarios = nsa.open_release(sys.argv[1], sys.argv[2])
    out = []
    for sc in scenarios:
        try:
            out.append(dict(nsa.resolve(sa, torch, sc), error=None))
        except Exception as e:  # reported, the check decides
            out.append(nsa.error_result(e))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
