"""Renderings of a ServeReport: a text table for people, JSON for the matrix, a PNG plot.

matplotlib is imported only by render_plot, so the table and JSON paths work
(and import fast) without it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from .metrics import Stats
from .report import ServeReport


def render_json(report: ServeReport) -> str:
    return json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n"


def _ms(stats: Optional[Stats]) -> str:
    return "-" if stats is None else f"{stats.p50:.1f}"


def _num(value: Optional[float], fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _table(headers: list[str], rows: list[list[str]], align: str) -> list[str]:
    """align: one letter per column, l or r (numbers right, text left)."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(cells, widths, align)).rstrip()

    return [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]


def render_table(report: ServeReport) -> str:
    d = report.deployment
    out = [
        f"serve smoke: {report.base_url}",
        f"  model {d.model}  engine {d.engine_version}  patch set {d.patch_set}",
    ]
    if report.answers is not None:
        out += ["", "coherence: answers"]
        out += _table(
            ["check", "result", "why", "reply"],
            [[a.name, "PASS" if a.passed else "FAIL", a.reason, a.reply_excerpt[:60]] for a in report.answers],
            "llll",
        )
    if report.golden is not None:
        g = report.golden
        source = f", from {g.golden_model} on {g.golden_engine_version}" if g.golden_model else ""
        out += ["", f"coherence: golden ({g.mode}, {g.path}{source})"]
        if g.diffs:
            out += _table(
                ["prompt", "result", "first divergence"],
                [
                    [
                        repr(x.prompt)[:40],
                        "same" if x.matched else "DIVERGED",
                        "-" if x.matched else f"{x.unit} {x.position}: expected {x.expected} got {x.got}",
                    ]
                    for x in g.diffs
                ],
                "lll",
            )
    if report.throughput is not None:
        tp = report.throughput
        out += ["", f"throughput ({'streaming' if tp.streamed else 'non-streaming'}, {tp.api}, max_tokens {tp.max_tokens}; latencies are p50 ms)"]
        out += _table(
            ["concurrency", "requests", "failed", "tok/s", "TTFT", "TPOT", "ITL", "E2E", "tokens by"],
            [
                [
                    str(lv.concurrency), str(lv.requests), str(lv.failed), _num(lv.output_tok_s),
                    _ms(lv.ttft_ms), _ms(lv.tpot_ms), _ms(lv.itl_ms), _ms(lv.e2e_ms), lv.token_count_method,
                ]
                for lv in tp.levels
            ],
            "rrrrrrrrl",
        )
    if report.baseline is not None:
        b = report.baseline
        out += ["", f"baseline ({b.status}, {b.path})"]
        out += ["  " + c.describe(b.threshold) for c in b.checks]
    if report.notes:
        out += ["", "notes:"] + [f"  {n}" for n in report.notes]
    out += [""]
    if report.ok:
        out.append(f"OK ({report.duration_s:.1f}s)")
    else:
        out.append(f"FAILED: {len(report.failures)} problem(s) ({report.duration_s:.1f}s)")
        out += [f"  - {f}" for f in report.failures]
    return "\n".join(out) + "\n"


def render_plot(report: ServeReport, path: Path) -> Optional[Path]:
    """Latency and throughput against concurrency; None when there is no throughput data."""
    if report.throughput is None or not report.throughput.levels:
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display on CI or a GPU box
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullLocator

    levels = report.throughput.levels
    xs = [lv.concurrency for lv in levels]
    fig, (ax_lat, ax_tp) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL")):
        pts = [(x, getattr(lv, name).p50) for x, lv in zip(xs, levels) if getattr(lv, name) is not None]
        if pts:
            ax_lat.plot(*zip(*pts), marker="o", label=f"{label} p50")
    ax_lat.set_ylabel("ms (log)")
    # TTFT under queueing is orders of magnitude above TPOT; linear would flatten TPOT.
    ax_lat.set_yscale("log")
    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    ax_lat.yaxis.set_major_formatter(plain)
    ax_lat.yaxis.set_minor_formatter(plain)
    ax_lat.set_title("latency")
    if ax_lat.get_legend_handles_labels()[0]:
        ax_lat.legend()
    tp_pts = [(x, lv.output_tok_s) for x, lv in zip(xs, levels) if lv.output_tok_s is not None]
    if tp_pts:
        ax_tp.plot(*zip(*tp_pts), marker="o", label="output tok/s")
    b = report.baseline
    if b is not None and b.checks:
        base_pts = sorted((c.concurrency, c.baseline) for c in b.checks if c.metric == "output_tok_s")
        if base_pts:
            ax_tp.plot(*zip(*base_pts), linestyle="--", marker="x", label="baseline")
    ax_tp.set_ylabel("output tokens / s")
    ax_tp.set_ylim(bottom=0)  # a 3% wobble should look like one
    ax_tp.set_title("throughput")
    for ax in (ax_lat, ax_tp):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.xaxis.set_minor_locator(NullLocator())  # only the measured levels get ticks
        ax.set_xlabel("concurrency")
    if ax_tp.get_legend_handles_labels()[0]:
        ax_tp.legend()
    d = report.deployment
    fig.suptitle(f"{d.model} · {d.engine_version} · patches {d.patch_set}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_outputs(report: ServeReport, json_path: Path) -> tuple[Path, Optional[Path]]:
    """JSON at json_path and the plot next to it (same name, .png)."""
    json_path = Path(json_path)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(render_json(report))
    return json_path, render_plot(report, json_path.with_suffix(".png"))
