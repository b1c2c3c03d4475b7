"""Click options and the terminal side of `patchctl smoke ENGINE --serve/--start`.

Kept here so patchctl/cli.py only has to attach the options and call
`run_from_cli`; everything below it (runner, render) stays terminal-free.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Optional

import click

from . import baseline as _baseline
from .process import ServerStartError, url_from_command
from .render import render_json, render_table, write_outputs
from .runner import ServeConfig, run_serve_smoke, run_with_server

DEFAULT_URL = "http://127.0.0.1:8000"


def _concurrency(_ctx, _param, value: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter("comma-separated integers, e.g. 1,8,32")
    if not levels or min(levels) < 1:
        raise click.BadParameter("at least one level, each >= 1")
    return levels


SERVE_OPTIONS: list[Callable] = [
    click.option("--serve", "serve_url", metavar="URL", help="Run the serve tier against this OpenAI-compatible server."),
    click.option("--start", "start_cmd", metavar="CMD",
                 help="Start this server command (e.g. \"vllm serve MODEL --port 8000\"), run the serve tier, stop it. "
                      "URL: --serve, else the command's --host/--port."),
    click.option("--ready-timeout", type=float, default=900.0, show_default=True, help="Seconds --start waits for the server."),
    click.option("--model", "serve_model", help="Model name to request (default: first of /v1/models)."),
    click.option("--engine-version", help="Engine version for the baseline key (default: the server's /version)."),
    click.option("--api-key", envvar="OPENAI_API_KEY", help="Bearer token, if the server wants one."),
    click.option("--answers/--no-answers", default=True, show_default=True, help="Coherence: prompts with checkable answers."),
    click.option("--reasoning-budget", type=int, default=0, show_default=True,
                 help="Extra max_tokens for every answers prompt, for reasoning models that think first."),
    click.option("--golden", "golden_path", type=click.Path(path_type=Path), help="Coherence: compare greedy outputs with this golden file."),
    click.option("--record-golden", is_flag=True, help="Record --golden from this (known-good) server instead of comparing."),
    click.option("--throughput/--no-throughput", default=True, show_default=True),
    click.option("--concurrency", default="1,8,32", show_default=True, callback=_concurrency),
    click.option("--requests", "requests_per_level", type=int, help="Requests per concurrency level (default: 2x concurrency, >= 4)."),
    click.option("--max-tokens", type=int, default=128, show_default=True),
    click.option("--stream/--no-stream", default=True, show_default=True, help="--no-stream reports no TTFT/TPOT/ITL."),
    click.option("--baseline-dir", type=click.Path(path_type=Path), help="Where baselines live (default: the user data dir)."),
    click.option("--update-baseline", is_flag=True, help="Record this run as the deployment's baseline."),
    click.option("--threshold", type=float, default=_baseline.DEFAULT_THRESHOLD, show_default=True,
                 help="Relative drop from the baseline that fails."),
    click.option("--json", "json_path", type=click.Path(path_type=Path),
                 help="Write the report as JSON here and the latency/throughput plot next to it (.png)."),
]


def serve_options(f: Callable) -> Callable:
    for option in reversed(SERVE_OPTIONS):
        f = option(f)
    return f


def run_from_cli(
    *,
    patch_set: str = "none",
    serve_url: Optional[str],
    start_cmd: Optional[str],
    ready_timeout: float,
    serve_model: Optional[str],
    engine_version: Optional[str],
    api_key: Optional[str],
    answers: bool,
    reasoning_budget: int,
    golden_path: Optional[Path],
    record_golden: bool,
    throughput: bool,
    concurrency: tuple[int, ...],
    requests_per_level: Optional[int],
    max_tokens: int,
    stream: bool,
    baseline_dir: Optional[Path],
    update_baseline: bool,
    threshold: float,
    json_path: Optional[Path],
) -> int:
    """Run, print the table (stdout), write JSON+PNG if asked; return the exit code."""
    if record_golden and golden_path is None:
        raise click.UsageError("--record-golden needs --golden PATH")
    config = ServeConfig(
        base_url=serve_url or (url_from_command(start_cmd) if start_cmd else DEFAULT_URL),
        model=serve_model,
        engine_version=engine_version,
        patch_set=patch_set,
        api_key=api_key,
        answers=answers,
        answers_extra_tokens=reasoning_budget,
        golden_path=golden_path,
        record_golden=record_golden,
        throughput=throughput,
        concurrency=concurrency,
        requests_per_level=requests_per_level,
        max_tokens=max_tokens,
        stream=stream,
        baseline_dir=baseline_dir,
        update_baseline=update_baseline,
        threshold=threshold,
    )
    progress = lambda msg: click.echo(msg, err=True)
    try:
        if start_cmd:
            report = run_with_server(config, start_cmd, ready_timeout_s=ready_timeout, progress=progress)
        else:
            report = run_serve_smoke(config, progress)
    except ServerStartError as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    click.echo(render_table(report), nl=False)
    if json_path is not None:
        if str(json_path) == "-":
            sys.stdout.write(render_json(report))
        else:
            written, png = write_outputs(report, json_path)
            click.echo(f"wrote {written}" + (f" and {png}" if png else ""), err=True)
    return 0 if report.ok else 1
