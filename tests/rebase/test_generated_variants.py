"""Generated variants (patch.yaml `generated_by`) match their sources: every such patch is regenerated
from its sources and the real releases, and must give exactly the committed variant files and their
series.yaml pins. A kernel edit committed without regenerating and re-pinning fails here. (And the
shape of `generated_by` that the store accepts.) The releases are the committed compat_matrix.yaml's
rows (support.releases), not the index's listing: a new upstream release reaches these tests
through the nightly's pull request, never by itself."""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from support.releases import committed_releases

from patchctl.core.errors import StoreError
from patchctl.store.layered import Store

REPO = Path(__file__).resolve().parents[2]
KERNEL = "kernels/sparse_mla/triton_sparse_mla.py"


def _generator(path: str):
    spec = importlib.util.spec_from_file_location("generate_variants", REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def releases(engine: str) -> list:
    """What the generator iterates here: the committed matrix's rows of the engine."""
    return [version for _, version in committed_releases(engine)]


def _declared():
    store = Store.open(REPO / "patches")
    return [p for e in store.engines() for p in store.series(e).patches if p.generated_by]


def differences(patch, variants: dict[str, bytes]) -> list[str]:
    """Generated variant files against the committed ones and their series.yaml pins."""
    committed = {v.filename: v for v in patch.variants}
    problems = [f"{name}: committed but not generated" for name in sorted(set(committed) - set(variants))]
    for name, data in sorted(variants.items()):
        if name not in committed:
            problems.append(f"{name}: generated but not committed")
            continue
        if committed[name].path.read_bytes() != data:
            problems.append(f"{name}: committed bytes differ from the generated ones")
        if committed[name].pinned_sha256 != hashlib.sha256(data).hexdigest():
            problems.append(f"{name}: series.yaml pin differs from the generated sha256")
    return problems


GOOD = {"generator": "scripts/gen.py", "sources": ["kernels/k.py"]}


@pytest.mark.parametrize(
    "value, complaint",
    [
        ("scripts/gen.py", "must be a mapping"),
        ({"sources": ["kernels/k.py"]}, "generated_by.generator"),
        ({"generator": "scripts/gen.py", "sources": []}, "generated_by.sources"),
        ({"generator": "scripts/gen.py", "sources": "kernels/k.py"}, "generated_by.sources"),
        (dict(GOOD, source=["typo.py"]), "unknown key(s) source"),
    ],
)
def test_generated_by_of_another_shape_is_a_store_error_naming_the_file(builder, value, complaint):
    builder.add("vllm", "p", variants={}, extra_meta={"generated_by": value})
    with pytest.raises(StoreError) as raised:
        Store.open(builder.root).series("vllm")
    assert complaint in raised.value.message and str(builder.root / "vllm" / "p" / "patch.yaml") in raised.value.message


def test_generated_by_is_exposed_and_optional(builder):
    builder.add("vllm", "made", variants={}, extra_meta={"generated_by": GOOD})
    builder.add("vllm", "by-hand", variants={})
    made, by_hand = Store.open(builder.root).series("vllm").patches
    assert made.generated_by == GOOD and by_hand.generated_by is None


@pytest.mark.network
def test_some_patches_declare_generated_variants():
    declared = {(p.engine, p.name) for p in _declared()}
    assert declared >= {("vllm", "triton-sparse-mla"), ("vllm", "dsa-indexer-fallback")}


@pytest.mark.network
@pytest.mark.parametrize("patch", _declared(), ids=lambda p: f"{p.engine}/{p.name}")
def test_committed_variants_and_pins_are_what_the_sources_give(patch):
    generator = _generator(patch.generated_by["generator"])
    generated = generator.generate(patch, repo=REPO, releases=releases(patch.engine))
    assert generated.variants, "the generator made no variant"
    assert not differences(patch, generated.variants), (
        "regenerate (python3 scripts/generate_variants.py), review, then `patchctl pin`:\n"
        + "\n".join(differences(patch, generated.variants))
    )
    assert not generator.differences(generated)  # what --check reports agrees


@pytest.mark.network
def test_a_changed_kernel_line_is_reported(tmp_path):
    """The comparison above can fail: one line of the kernel changed (a temporary copy) changes
    every triton-sparse-mla variant (the kernel is shipped verbatim in each), and --check names them."""
    store = Store.open(REPO / "patches")
    patch = store.series("vllm").get("triton-sparse-mla")
    assert KERNEL in patch.generated_by["sources"]
    lines = (REPO / KERNEL).read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("def "))
    lines.insert(at, "# one changed line\n")
    kernel = tmp_path / "triton_sparse_mla.py"
    kernel.write_text("".join(lines))

    generator = _generator(patch.generated_by["generator"])
    generated = generator.generate(patch, repo=REPO, sources={KERNEL: kernel}, releases=releases(patch.engine))
    problems = differences(patch, generated.variants)
    committed = {v.filename for v in patch.variants}
    assert {p.split(":")[0] for p in problems} == committed, problems
    assert all(any(n in p for p in generator.differences(generated)) for n in committed)

    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "generate_variants.py"),
            "--check",
            "--only",
            "triton-sparse-mla",
            "--kernel",
            str(kernel),
            *(f"--release={v}" for v in releases(patch.engine)),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for name in committed:
        assert f"out of date: vllm/triton-sparse-mla/{name}: differs" in proc.stdout, proc.stdout


@pytest.mark.network
@pytest.mark.slow
def test_each_release_family_ships_its_own_backend_source(tmp_path):
    """triton-sparse-mla ships src/triton_mla_sparse.py before vLLM 0.24 and src/triton_mla_sparse_v24.py
    (the fallback for upstream's SM12x backend) from 0.24: one changed line of the 0.24+ source
    changes exactly the variants of releases that have upstream's SM12x backend, and no older
    variant is reused across the two families."""
    store = Store.open(REPO / "patches")
    patch = store.series("vllm").get("triton-sparse-mla")
    v24 = "patches/vllm/triton-sparse-mla/src/triton_mla_sparse_v24.py"
    assert v24 in patch.generated_by["sources"]
    text = (REPO / v24).read_text()
    changed = tmp_path / "triton_mla_sparse_v24.py"
    changed.write_text(
        text.replace("\nlogger = init_logger(__name__)\n", "\nlogger = init_logger(__name__)\n# one changed line\n", 1)
    )
    assert changed.read_text() != text

    generator = _generator(patch.generated_by["generator"])
    base = generator.generate(patch, repo=REPO, releases=releases(patch.engine))
    other = generator.generate(patch, repo=REPO, sources={v24: changed}, releases=releases(patch.engine))
    from packaging.version import Version

    new_family = {n for v, n in base.chosen.items() if Version(v) >= Version("0.24")}
    old_family = {n for v, n in base.chosen.items() if Version(v) < Version("0.24")}
    assert new_family and old_family and not new_family & old_family, base.chosen
    assert other.chosen == base.chosen
    differ = {n for n in base.variants if base.variants[n] != other.variants[n]}
    assert differ == new_family, (differ, new_family)
    for name in new_family:
        assert b"+# one changed line" in other.variants[name]


def test_the_generator_iterates_the_committed_rows_whatever_the_index_lists(tmp_path, monkeypatch, fresh_cache):
    """An index listing every committed vLLM release and a newer one: the releases the tests above
    generate for are the committed rows the patch claims, and the index's newer one is not among them."""
    from packaging.version import Version
    from support.builders import build_wheel
    from support.index_server import IndexServer

    from patchctl.sources.fetch import SourceContext

    generator = _generator("scripts/generate_variants.py")
    patch = Store.open(REPO / "patches").series("vllm").get("triton-sparse-mla")
    committed = releases("vllm")
    files = tmp_path / "files"
    with IndexServer(files) as server:
        for version in [*committed, Version("999.0")]:
            server.add("vllm", build_wheel(files, "vllm", str(version), {"vllm/__init__.py": ""}))
        ctx = SourceContext(index_url=server.url)
        from_index = generator.release_versions(patch, ctx, None)
        chosen = generator.release_versions(patch, ctx, None, releases(patch.engine))
    assert Version("999.0") in from_index  # the stand-in index does list it (the script's default)
    assert chosen == [v for v in committed if patch.in_range(v)] and len(chosen) >= 10
