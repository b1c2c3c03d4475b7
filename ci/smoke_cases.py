#!/usr/bin/env python3
"""Which smoke cases (tests/test_real_smoke.py) a change needs: pre-commit's testing/languages
pattern, for patches. CI's smoke job runs only these.

  python3 ci/smoke_cases.py --base REF [--head REF]   # the paths of `git diff --name-only BASE...HEAD`
  python3 ci/smoke_cases.py --files PATH...           # these changed paths

Prints {"all", "reasons", "cases", "nodes"}: whether every case runs, why each case (or all) was
chosen, the cases' pytest ids and node ids. With GITHUB_OUTPUT set (inside Actions) it also writes
`cases` there: a JSON list for `fromJSON` in a matrix strategy.

Rules, paths relative to the repository root (first match wins):
  every case   patchctl/ (the smoke machinery is in it), patches/checklib/ and patches/envs/ (every
               check's library and environments), the smoke tests and their support
               (tests/test_real_smoke.py, tests/conftest.py, tests/support/), the package's build
               (pyproject.toml, setup.py), this selection and the workflow that runs it; any other
               path under patches/; and any diff git cannot make (a branch's first push has no BASE);
  ENGINE       patches/ENGINE/series.yaml, or a patch folder the store no longer has: every case
               of ENGINE;
  a patch      patches/ENGINE/PATCH/..., or a source its patch.yaml's generated_by lists (the
               kernel): the cases of ENGINE where PATCH applies or is upstreamed. A case runs every
               patch's checks on the patched tree, so a patch's variant is under test wherever it
               applies, not only at its own bases;
  nothing      anything else (docs, benchmarks, the other tests).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
SMOKE_TESTS = "tests/test_real_smoke.py"
SMOKE_TEST = "test_patch_checks_pass_on_the_release"
EVERYTHING = (
    "patchctl/",
    "patches/checklib/",
    "patches/envs/",
    SMOKE_TESTS,
    "tests/conftest.py",
    "tests/support/",
    "pyproject.toml",
    "setup.py",
    "MANIFEST.in",
    "ci/smoke_cases.py",
    ".github/workflows/ci.yml",
)
# git's name for "no commit": github.event.before on a branch's first push.
NO_COMMIT = "0" * 40


def smoke_module():
    """tests/test_real_smoke.py, whose cases() and case_id() define the cases and their ids."""
    spec = importlib.util.spec_from_file_location("real_smoke_cases", ROOT / SMOKE_TESTS)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def select(changed: list[str], store, all_cases: list[tuple[str, str]], store_dir: str = "patches") -> dict:
    """The cases `changed` needs, out of `all_cases` ((engine, version), as the smoke tests list them)."""
    reasons: dict[tuple[str, str], list[str]] = {}
    everything: list[str] = []
    by_source: dict[str, list] = {}
    for engine in store.engines():
        for patch in store.series(engine).patches:
            for source in (patch.generated_by or {}).get("sources", []):
                by_source.setdefault(source, []).append(patch)

    def add(cases: list[tuple[str, str]], why: str) -> None:
        for case in cases:
            reasons.setdefault(case, []).append(why)

    def patch_cases(patch) -> list[tuple[str, str]]:
        return [
            (e, v) for e, v in all_cases if e == patch.engine and (patch.in_range(Version(v)) or patch.upstreamed_at(Version(v)))
        ]

    for path in changed:
        if path.startswith(EVERYTHING):
            everything.append(path)
        elif path in by_source:
            for patch in by_source[path]:
                add(patch_cases(patch), f"{path} (a source of {patch.engine}/{patch.name})")
        elif path.startswith(f"{store_dir}/"):
            parts = path.split("/")
            engine = parts[1] if len(parts) > 2 else None
            if engine not in store.engines():
                everything.append(path)
                continue
            series = {p.name: p for p in store.series(engine).patches}
            if len(parts) > 3 and parts[2] in series:
                add(patch_cases(series[parts[2]]), f"{path} ({engine}/{parts[2]})")
            else:
                add([c for c in all_cases if c[0] == engine], f"{path} (every {engine} case)")
    chosen = sorted(all_cases) if everything else sorted(reasons)
    return {
        "all": bool(everything),
        "reasons": [f"every case: {p}" for p in everything]
        if everything
        else [f"{e}-{v}: {'; '.join(reasons[(e, v)])}" for e, v in chosen],
        "cases": chosen,
    }


def changed_paths(base: str | None, head: str, repo: Path = ROOT) -> list[str] | None:
    """`git diff --name-only BASE...HEAD`, or None where there is no such diff (no BASE, an
    all-zero one, or a BASE this clone lacks): the caller then runs every case."""
    if not base or base == NO_COMMIT:
        return None
    proc = subprocess.run(["git", "diff", "--name-only", f"{base}...{head}"], cwd=repo, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"smoke_cases: git diff {base}...{head} failed: {proc.stderr.strip()}", file=sys.stderr)
        return None
    return [line for line in proc.stdout.splitlines() if line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="the commit the change starts from (a pull request's base, a push's before)")
    parser.add_argument("--head", default="HEAD")
    parser.add_argument("--files", nargs="*", help="the changed paths themselves (instead of --base)")
    args = parser.parse_args(argv)

    from patchctl.store.layered import Store

    smoke = smoke_module()
    store = Store.open(ROOT / "patches")
    all_cases = smoke.cases(store)
    changed = args.files if args.files is not None else changed_paths(args.base, args.head)
    if changed is None:
        doc = {"all": True, "reasons": [f"every case: no diff against base {args.base!r}"], "cases": sorted(all_cases)}
    else:
        doc = select(changed, store, all_cases)
    ids = [smoke.case_id(e, v) for e, v in doc["cases"]]
    doc = {**doc, "cases": ids, "nodes": [f"{SMOKE_TESTS}::{SMOKE_TEST}[{i}]" for i in ids]}
    print(json.dumps(doc, indent=2))
    github_output = os.environ.get("GITHUB_OUTPUT")
    if github_output:
        with open(github_output, "a", encoding="utf-8") as out:
            out.write(f"cases={json.dumps(ids)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
