"""The click side of `patchctl smoke ENGINE --serve URL | --start CMD`.

patchctl/cli.py attaches `serve_options` to its smoke command and, when
--serve or --start is given, hands over to `serve_smoke`, which returns the
(document, exit code) pair every patchctl command returns. The core (runner,
render) stays free of click and of the terminal.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import click

from patchctl import report as _doc
from patchctl.errors import EXIT_OK, EXIT_PATCH_FAILED

from . import baseline as _baseline
from .process import url_from_command
from .render import render_table, write_outputs
from .report import ServeReport
from .runner import ServeConfig, run_serve_smoke, run_with_server

DEFAULT_URL = "http://127.0.0.1:8000"


def _concurrency(_ctx, _param, value: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter("comma-separated integers, e.g. 1,8,32") from None
    if not levels or min(levels) < 1:
        raise click.BadParameter("at least one level, each >= 1")
    return levels


SERVE_OPTIONS: list[Callable] = [
    click.option("--serve", "serve_url", metavar="URL",
                 help="Serve tier: validate this running OpenAI-compatible server."),
    click.option("--start", "start_cmd", metavar="CMD",
                 help="Serve tier: start this server command (e.g. \"vllm serve MODEL --port 8000\"), validate it, "
                      "stop it. Its URL: --serve, else the command's --host/--port."),
    click.option("--ready-timeout", type=float, default=900.0, show_default=True,
                 help="Seconds --start waits for the server to answer."),
    click.option("--model", "serve_model", help="Model to request (default: the first of /v1/models)."),
    click.option("--engine-version", help="Engine version for the baseline key (default: the server's /version)."),
    click.option("--api-key", envvar="OPENAI_API_KEY", help="Bearer token, if the server wants one."),
    click.option("--answers/--no-answers", default=True, show_default=True,
                 help="Coherence: prompts with checkable answers (fact, arithmetic, counting, code)."),
    click.option("--reasoning-budget", type=int, default=0, show_default=True,
                 help="Extra max_tokens per answers prompt, for reasoning models that think first."),
    click.option("--golden", "golden_path", type=click.Path(dir_okay=False, path_type=Path),
                 help="Coherence: compare greedy outputs token by token with this golden file."),
    click.option("--record-golden", is_flag=True, help="Record --golden from this (known-good) server instead."),
    click.option("--throughput/--no-throughput", default=True, show_default=True),
    click.option("--concurrency", default="1,8,32", show_default=True, callback=_concurrency),
    click.option("--requests", "requests_per_level", type=click.IntRange(min=1),
                 help="Requests per concurrency level (default: 2 x concurrency, at least 4)."),
    click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True),
    click.option("--stream/--no-stream", default=True, show_default=True,
                 help="--no-stream measures latency and tok/s only (no TTFT/TPOT/ITL)."),
    click.option("--baseline-dir", type=click.Path(file_okay=False, path_type=Path),
                 help="Where per-deployment baselines live (default: patchctl's data dir)."),
    click.option("--update-baseline", is_flag=True, help="Record this run as the deployment's baseline."),
    click.option("--threshold", type=click.FloatRange(min=0), default=_baseline.DEFAULT_THRESHOLD, show_default=True,
                 help="Relative drop from the baseline that fails (0.05 = 5%)."),
    click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path),
                 help="Also write the serve report as JSON here and its latency/throughput plot next to it (.png)."),
]


def serve_options(f: Callable) -> Callable:
    for option in reversed(SERVE_OPTIONS):
        f = option(f)
    return f


def serve_requested(serve_url: Optional[str], start_cmd: Optional[str], **_: Any) -> bool:
    return bool(serve_url or start_cmd)


def config_from_options(patch_set: str, **o: Any) -> ServeConfig:
    start_cmd = o.get("start_cmd")
    return ServeConfig(
        base_url=o.get("serve_url") or (url_from_command(start_cmd) if start_cmd else DEFAULT_URL),
        model=o.get("serve_model"),
        engine_version=o.get("engine_version"),
        patch_set=patch_set,
        api_key=o.get("api_key"),
        answers=o.get("answers", True),
        answers_extra_tokens=o.get("reasoning_budget", 0),
        golden_path=o.get("golden_path"),
        record_golden=o.get("record_golden", False),
        throughput=o.get("throughput", True),
        concurrency=o.get("concurrency", (1, 8, 32)),
        requests_per_level=o.get("requests_per_level"),
        max_tokens=o.get("max_tokens", 128),
        stream=o.get("stream", True),
        baseline_dir=o.get("baseline_dir"),
        update_baseline=o.get("update_baseline", False),
        threshold=o.get("threshold", _baseline.DEFAULT_THRESHOLD),
    )


def serve_smoke(
    engine: str, patch_set: str, progress: Optional[Callable[[str], None]] = None, **options: Any
) -> tuple[dict, int]:
    """Run the serve tier from CLI options; (document, exit code) like every command.

    Raises ServerStartError / EnvironmentProblem (exit 3) and UsageError (exit 2)
    for the caller's usual error handling.
    """
    config = config_from_options(patch_set, **options)
    start_cmd = options.get("start_cmd")
    if start_cmd:
        result = run_with_server(config, start_cmd, ready_timeout_s=options.get("ready_timeout", 900.0),
                                 progress=progress)
    else:
        result = run_serve_smoke(config, progress)
    files: dict[str, Optional[str]] = {}
    out_path = options.get("out_path")
    if out_path is not None:
        written, png = write_outputs(result, out_path)
        files = {"json": str(written), "png": str(png) if png else None}
    code = EXIT_OK if result.ok else EXIT_PATCH_FAILED
    return _doc.document("smoke", code, engine=engine, tier="serve", serve=result.to_json(), files=files), code


def render_serve_document(doc: dict) -> str:
    """Text for people, from the document serve_smoke returned (e.g. in report.print_document)."""
    text = render_table(ServeReport.from_json(doc["serve"]))
    if doc.get("files"):
        text += "".join(f"wrote {path}\n" for path in doc["files"].values() if path)
    return text
