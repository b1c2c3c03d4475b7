"""What `validate --out FILE.json` writes: the serve report as JSON, and next to it (same name, .png)
its latency/throughput plot.

The plot needs matplotlib, which comes with the plot extra (pip install 'patchctl[plot]'); it is
imported only here, only when a plot is drawn. Without it the JSON is still written, and the
missing plot is a warning, not a failure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from patchctl.core.atomic import write_atomic
from patchctl.core.errors import PlotUnavailable
from patchctl.validate.metrics import BUFFERED, LevelMetrics
from patchctl.validate.report import ServeReport

if TYPE_CHECKING:
    from types import ModuleType

# How to add the extra depends on how patchctl was installed (issue 36: `pip install` is wrong under pipx).
PLOT_NEEDS_EXTRA = (
    "the latency/throughput plot needs matplotlib (the plot extra): under pipx `pipx inject patchctl "
    "matplotlib`; under uv `uv tool install --reinstall '.[plot]'` in patchctl's checkout (a uv venv: "
    "`uv pip install matplotlib`); in a venv `pip install matplotlib` with that venv active"
)


class Written(NamedTuple):
    json_path: Path
    png_path: Path | None  # None: no throughput data to plot, or no matplotlib
    warnings: tuple[str, ...]


def write_outputs(report: ServeReport, json_path: Path) -> Written:
    """The report as JSON at json_path and its plot next to it."""
    json_path = Path(json_path)
    write_atomic(json_path, (json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n").encode())
    try:
        png = render_plot(report, json_path.with_suffix(".png"))
    except PlotUnavailable:
        return Written(json_path, None, (PLOT_NEEDS_EXTRA,))
    return Written(json_path, png, ())


def _pyplot() -> ModuleType:
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(PLOT_NEEDS_EXTRA) from None
    matplotlib.use("Agg")  # no display on CI or a GPU box
    import matplotlib.pyplot as plt

    return plt


def _decode_panel(ax: Any, xs: list[int], levels: Sequence[LevelMetrics]) -> None:
    """Per request: the decode rate (1/TPOT) and output tokens over E2E, p50 of each level."""
    for name, label in (("decode_tok_s", "decode rate (1/TPOT)"), ("request_tok_s", "tokens / E2E")):
        pts = [(x, getattr(lv, name).p50) for x, lv in zip(xs, levels, strict=True) if getattr(lv, name) is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=f"{label} p50")
    for x, lv in zip(xs, levels, strict=True):
        if lv.latency_not_measured:
            ax.annotate(
                f"not measured:\n{lv.latency_not_measured}",
                (x, 0),
                xytext=(0, 12),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color="red",
            )
    ax.set_ylabel("tokens / s, one request")
    ax.set_ylim(bottom=0)
    ax.set_title("per request")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def _stream_verdict(levels: Sequence[LevelMetrics]) -> str:
    buffered = [lv.concurrency for lv in levels if lv.stream == BUFFERED]
    if buffered:
        return "stream: BUFFERED at " + ", ".join(f"c={c}" for c in buffered) + " (latencies not measured)"
    verdicts = sorted({lv.stream for lv in levels if lv.stream})
    return "stream: " + (", ".join(verdicts) if verdicts else "unknown")


def _reasoning_split(levels: Sequence[LevelMetrics]) -> str:
    """Reasoning vs answer tokens per level, when any level reasoned."""
    if not any(lv.reasoning_tokens for lv in levels):
        return ""
    parts = []
    for lv in levels:
        if lv.reasoning_tokens is None:
            continue
        cut = f", {lv.ended_in_reasoning} cut in reasoning" if lv.ended_in_reasoning else ""
        parts.append(f"c={lv.concurrency}: {lv.reasoning_tokens}/{lv.content_tokens}{cut}")
    return "reasoning/answer tokens (from chunks): " + "; ".join(parts)


def render_plot(report: ServeReport, path: Path) -> Path | None:
    """Latency and throughput against concurrency; None when there is no throughput data.
    PlotUnavailable without matplotlib."""
    if report.throughput is None or not report.throughput.levels:
        return None
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter, NullLocator

    levels = report.throughput.levels
    xs = [lv.concurrency for lv in levels]
    fig, (ax_lat, ax_tp, ax_dec) = plt.subplots(1, 3, figsize=(15, 4.6))
    for name, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL")):
        pts = [(x, getattr(lv, name).p50) for x, lv in zip(xs, levels, strict=True) if getattr(lv, name) is not None]
        if pts:
            ax_lat.plot(*zip(*pts, strict=True), marker="o", label=f"{label} p50")
    ax_lat.set_ylabel("ms (log)")
    # TTFT under queueing is orders of magnitude above TPOT; linear would flatten TPOT.
    ax_lat.set_yscale("log")
    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    ax_lat.yaxis.set_major_formatter(plain)
    ax_lat.yaxis.set_minor_formatter(plain)
    ax_lat.set_title("latency")
    if ax_lat.get_legend_handles_labels()[0]:
        ax_lat.legend()
    tp_pts = [(x, lv.output_tok_s) for x, lv in zip(xs, levels, strict=True) if lv.output_tok_s is not None]
    if tp_pts:
        ax_tp.plot(*zip(*tp_pts, strict=True), marker="o", label="output tok/s")
    b = report.baseline
    if b is not None and b.checks:
        base_pts = sorted((c.concurrency, c.baseline) for c in b.checks if c.metric == "output_tok_s")
        if base_pts:
            ax_tp.plot(*zip(*base_pts, strict=True), linestyle="--", marker="x", label="baseline")
    ax_tp.set_ylabel("output tokens / s")
    ax_tp.set_ylim(bottom=0)  # a 3% wobble should look like one
    ax_tp.set_title("throughput")
    _decode_panel(ax_dec, xs, levels)
    for ax in (ax_lat, ax_tp, ax_dec):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.xaxis.set_minor_locator(NullLocator())  # only the measured levels get ticks
        ax.set_xlabel("concurrency")
    if ax_tp.get_legend_handles_labels()[0]:
        ax_tp.legend()
    d = report.deployment
    fig.suptitle(f"{d.model} · {d.engine_version} · patches {d.patch_set} · {_stream_verdict(levels)}", fontsize=10)
    split = _reasoning_split(levels)
    if split:
        fig.text(0.5, 0.01, split, ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.04 if split else 0, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
