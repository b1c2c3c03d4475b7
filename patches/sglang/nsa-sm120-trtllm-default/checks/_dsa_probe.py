"""Resolve SGLang's NSA/DSA prefill/decode backend defaults for a list of scenarios.

Run as a subprocess (one release tree per process): `python _dsa_probe.py <tree> <scenarios.json>`.
Reports (checklib.probe) {"results": [...]}, per scenario {"prefill", "decode", "error"}.

Each scenario: {"capability": [12, 0], "kv_cache_dtype": "fp8_e4m3", "prefill": null,
"decode": null, "arch": "GlmMoeDsaForCausalLM"}. `prefill`/`decode` are what the user passed
(null = not set). The device capability is stubbed where upstream reads it: see
checklib/sglang/_nsa_resolution.py, shared with the guard patch's checks.
"""

import sys

from checklib.sglang import _nsa_resolution as nsa  # shared with the guard patch's checks


def main() -> None:
    sa, torch, scenarios = nsa.open_release(sys.argv[1], sys.argv[2])
    out = []
    for sc in scenarios:
        try:
            out.append(dict(nsa.resolve(sa, torch, sc), error=None))
        except Exception as e:  # reported, the check decides
            out.append(nsa.error_result(e))
    nsa.report(out)


if __name__ == "__main__":
    main()
