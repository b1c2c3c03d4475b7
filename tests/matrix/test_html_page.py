"""The HTML rendering of compat_matrix.yaml: escaping, self-containedness, and what a real browser
draws from a matrix built against a local package index."""

import re
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from support.fixtures import four_release_index

from patchctl.cli.main import main
from patchctl.matrix.html_page import STYLE, render_html

CHROMIUM = "/usr/bin/chromium"

HOSTILE = '<script>alert("x")</script>'

DOC = {
    "schema": "patchctl-matrix/1",
    "engines": {
        "vllm": {
            "patches": ["gguf-loader", HOSTILE],
            "versions": {
                "0.10.0": {
                    "version": "0.10.0",
                    "artifact": "vllm-0.10.0-py3-none-any.whl",
                    "sha256": "a" * 64,
                    "patches": {
                        "gguf-loader": {
                            "outcome": "clean",
                            "variant": "0.10.0.patch",
                            "smoke": {"status": "passed", "reason": "3 passed"},
                            "evidence": "GGUF tokens match the golden output",
                        },
                        HOSTILE: {"outcome": "offset", "variant": "0.10.0.patch", "hunks_moved": 2},
                    },
                },
                "0.11.0": {
                    "version": "0.11.0",
                    "sha256": "b" * 64,
                    "patches": {
                        "gguf-loader": {"outcome": "fuzz", "variant": "0.10.0.patch"},
                        HOSTILE: {
                            "outcome": "three-way",
                            "variant": "0.10.0.patch",
                            "smoke": {"status": "failed", "reason": "1 check(s) failed & <more>"},
                        },
                    },
                },
                "0.12.0": {
                    "version": "0.12.0",
                    "sha256": "c" * 64,
                    "patches": {
                        "gguf-loader": {"outcome": "conflict", "variant": "0.10.0.patch"},
                        HOSTILE: {"outcome": "already-applied", "variant": "0.10.0.patch"},
                    },
                },
                "0.13.0": {
                    "version": "0.13.0",
                    "sha256": "d" * 64,
                    "patches": {
                        "gguf-loader": {"outcome": "upstreamed", "variant": "0.10.0.patch", "drop": "drop_when vllm>=0.13 holds"},
                        HOSTILE: {"outcome": "obsolete", "variant": None},
                    },
                },
                "0.14.0": {"version": "0.14.0", "error": "no wheel <for> 0.14.0", "patches": {}},
                "nightly": {
                    "version": "0.15.0.dev3",
                    "nightly_of": "vllm nightly 0.15.0.dev3+g1234abc",
                    "sha256": "e" * 64,
                    "patches": {
                        "gguf-loader": {"outcome": "clean", "variant": "0.10.0.patch", "evidence": "applies (smoke not run)"},
                        HOSTILE: {"outcome": "conflict", "variant": "0.10.0.patch", "evidence": "outcome only"},
                    },
                },
            },
            "nightly": "ran on vllm nightly 0.15.0.dev3+g1234abc",
        }
    },
}


def test_every_outcome_has_its_own_colour_and_a_legend_entry():
    page = render_html(DOC)
    backgrounds = [bg for bg, _, _ in STYLE.values()]
    assert len(set(backgrounds)) == len(backgrounds)
    for outcome in ("clean", "offset", "fuzz", "three-way", "already-applied", "upstreamed", "obsolete", "conflict", "error"):
        css = "o-" + outcome.replace("-", "_")
        assert f'class="cell {css}' in page, outcome
        assert f'class="swatch {css}"' in page, outcome


def test_cells_carry_variant_sha256_smoke_and_evidence():
    page = render_html(DOC)
    assert 'title="sha256: ' + "a" * 64 in page
    assert '<span class="variant">0.10.0</span>' in page
    assert "smoke ✔ passed" in page and "smoke ✘ failed" in page
    assert "GGUF tokens match the golden output" in page
    assert "2 hunk(s) moved" in page
    assert 'colspan="2"' in page  # the error row spans both patch columns
    assert '<span class="note evidence">applies (smoke not run)</span>' in page
    assert "nightly: ran on vllm nightly 0.15.0.dev3+g1234abc" in page
    assert 'title="nightly: vllm nightly 0.15.0.dev3+g1234abc\nversion: 0.15.0.dev3\nsha256: ' in page


def test_nightly_report_leads_with_changes_first_bad_and_caveats_newest_first():
    import copy

    doc = copy.deepcopy(DOC)
    doc["engines"]["vllm"]["evidence"] = {"gguf-loader": {"proven": ["x"], "not_proven": ["SM120 itself: not available"]}}
    previous = copy.deepcopy(DOC)
    del previous["engines"]["vllm"]["versions"]["0.13.0"]
    previous["engines"]["vllm"]["versions"]["0.12.0"]["patches"]["gguf-loader"]["outcome"] = "clean"
    page = render_html(doc, previous=previous)
    changes = page[page.index('id="changes"') : page.index('class="legend"')]
    assert "New releases (1)" in changes and "vllm 0.13.0" in changes
    assert "Newly failing (1)" in changes and "vllm 0.12.0 <code>gguf-loader</code>: clean → conflict" in changes
    assert "Newly upstreamed (1)" in changes  # 0.13.0 is new: compared with nothing, so "new → upstreamed"
    assert "first bad 0.12.0" in page
    assert "does not prove: SM120 itself: not available" in page
    rows = re.findall(r'<th class="version" scope="row"[^>]*>([^<]+)</th>', page)
    assert rows == ["nightly", "0.14.0", "0.13.0", "0.12.0", "0.11.0", "0.10.0"]
    assert 'id="changes"' not in render_html(doc)  # no previous matrix: no "since" section


def test_everything_from_the_document_is_escaped():
    page = render_html(DOC)
    assert HOSTILE not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "no wheel &lt;for&gt; 0.14.0" in page
    assert "failed &amp; &lt;more&gt;" in page


def test_page_loads_nothing_from_outside():
    page = render_html(DOC)
    for pattern in (r"\bsrc=", r"<link\b", r"url\(", r"@import", r"://"):
        assert not re.search(pattern, page), pattern


def test_unknown_outcome_and_missing_cell_are_shown_not_dropped():
    doc = {
        "schema": "patchctl-matrix/1",
        "engines": {
            "sglang": {"patches": ["a", "b"], "versions": {"1.0": {"version": "1.0", "patches": {"a": {"outcome": "mystery"}}}}}
        },
    }
    page = render_html(doc)
    assert ">mystery<" in page
    assert 'title="not evaluated"' in page


# --- a real browser -------------------------------------------------------------------------


def decode_png(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, channels, raw pixel rows without filter bytes) of an 8-bit RGB/RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, f"unsupported PNG: {header}"
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    out = bytearray(height * stride)
    prev = bytearray(stride)
    for y in range(height):
        filt = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        if filt == 1:
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 0xFF
        elif filt == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev, strict=False))
        elif filt == 3:
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif filt == 4:
            for i in range(stride):
                a = line[i - channels] if i >= channels else 0
                b = prev[i]
                c = prev[i - channels] if i >= channels else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        out[y * stride : (y + 1) * stride] = line
        prev = line
    return width, height, channels, bytes(out)


def pixel_count(pixels: bytes, channels: int, hex_colour: str) -> int:
    rgb = bytes.fromhex(hex_colour.lstrip("#"))
    if channels == 3:
        return sum(1 for i in range(0, len(pixels), 3) if pixels[i : i + 3] == rgb)
    return sum(1 for i in range(0, len(pixels), 4) if pixels[i : i + 3] == rgb and pixels[i + 3] == 0xFF)


@pytest.fixture
def built_matrix(tmp_path, builder, fresh_cache):
    """Four real wheels on a local index: the one patch is clean, offset, conflict, upstreamed."""
    out = tmp_path / "compat_matrix.yaml"
    with four_release_index(tmp_path, builder) as server:
        result = CliRunner().invoke(
            main,
            ["matrix", "-o", str(out), "--index-url", server.url, "--store", str(builder.root), "--no-nightly", "--json"],
            catch_exceptions=False,
        )
    assert result.exit_code == 0, result.output
    return yaml.safe_load(out.read_text())


@pytest.mark.slow
@pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} not installed (ci/install_browser.sh installs Debian's chromium)"
)
def test_browser_screenshot_shows_the_outcome_colours(built_matrix, tmp_path):
    outcomes = {v: r["patches"]["loader"]["outcome"] for v, r in built_matrix["engines"]["vllm"]["versions"].items()}
    assert outcomes == {"1.0": "clean", "1.1": "offset", "1.2": "conflict", "1.3": "upstreamed"}
    page = tmp_path / "matrix.html"
    page.write_text(render_html(built_matrix), encoding="utf-8")
    shot = tmp_path / "matrix.png"
    profile = tmp_path / "chromium-profile"
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--screenshot={shot}",
        "--window-size=1600,1000",
        page.as_uri(),
    ]
    result = subprocess.run(
        cmd, capture_output=True, text=True, timeout=180, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    )
    assert shot.is_file(), f"no screenshot (exit {result.returncode}): {result.stderr[-2000:]}"
    width, height, channels, pixels = decode_png(shot.read_bytes())
    assert (width, height) == (1600, 1000)  # readable at 1600 px wide
    counts = {o: pixel_count(pixels, channels, STYLE[o][0]) for o in ("clean", "offset", "conflict", "upstreamed")}
    # A cell is at least 150×44 CSS pixels; text and rounded corners take some of it.
    for outcome, count in counts.items():
        assert count > 2000, (outcome, counts)
    # Outcomes the matrix does not contain appear only as legend swatches (about 300 pixels each).
    for absent in ("fuzz", "error"):
        assert pixel_count(pixels, channels, STYLE[absent][0]) < 1000, absent
