"""`patchctl validate`: check a running OpenAI-compatible server (or one it starts and stops) — coherence
(answers, golden), throughput, and the deployment's baseline.

The work is done by the serve tier's core, patchctl/validate/ (imported inside `run`, so that `--help`
imports neither requests nor matplotlib); this module owns the options, the document and the text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.documents import document
from patchctl.cli.options import as_version_option
from patchctl.cli.validate_text import render
from patchctl.core.errors import EXIT_ENVIRONMENT, EXIT_OK, EXIT_PATCH_FAILED, UsageError
from patchctl.sources.spec import parse_spec
from patchctl.validate.baseline import DEFAULT_THRESHOLD

if TYPE_CHECKING:
    from packaging.version import Version

    from patchctl.sources.spec import EngineRef
    from patchctl.tree.bookkeeping import StateRecord

DEFAULT_CONCURRENCY = (1, 8, 32)


def parse_levels(text: str) -> tuple[int, ...]:
    """`1,8,32` → (1, 8, 32); UsageError for anything else."""
    try:
        levels = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"concurrency {text!r}: comma-separated integers, e.g. 1,8,32") from None
    if not levels or min(levels) < 1:
        raise UsageError(f"concurrency {text!r}: at least one level, each >= 1")
    return levels


def run(
    engine: str,
    *,
    url: str | None = None,
    start: str | None = None,
    ready_timeout: float = 900.0,
    timeout: float = 300.0,
    level_timeout: float | None = None,
    model: str | None = None,
    engine_version: str | None = None,
    api_key: str | None = None,
    python: str | None = None,
    target_dir: str | None = None,
    as_version: Version | None = None,
    patch_set: str | None = None,
    answers: bool = True,
    reasoning_budget: int = 0,
    golden: Path | str | None = None,
    record_golden: bool = False,
    long_context: str = "quick",
    long_context_budget: float | None = None,
    max_context: int | None = None,
    throughput: bool = True,
    concurrency: Sequence[int] | str = DEFAULT_CONCURRENCY,
    requests_per_level: int | None = None,
    prompt: str = "counting",
    shared_prompt: bool = False,
    max_tokens: int = 128,
    stream: bool = True,
    baseline_dir: Path | str | None = None,
    update_baseline: bool = False,
    threshold: float = DEFAULT_THRESHOLD,
    accept_baseline_mismatch: bool = False,
    out: Path | str | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict, int]:
    """Validate the server at `url`, or the one `start` starts (its URL: `url`, else the command's
    --host/--port); (document, exit code): 0 every check passed, 1 one failed (a request past its
    deadline among them), 3 a reply broke the protocol or a limit (NetworkError, also exit 3: the
    server never answered)."""
    import shlex

    from patchctl.validate.outputs import write_outputs
    from patchctl.validate.process import url_from_command
    from patchctl.validate.provenance import record_facts
    from patchctl.validate.throughput import resolve_prompt
    from patchctl.validate.validation import ServeConfig, run_validate, run_with_server

    ref = parse_spec(engine)
    if not url and not start:
        raise UsageError(
            "validate needs a server: --url URL (one that is running) or --start CMD "
            "(a server command patchctl starts, validates and stops)",
            hint=f"e.g. patchctl validate {ref.engine.name} --url http://127.0.0.1:8000",
        )
    argv: list[str] = []
    if start is not None:
        try:
            argv = shlex.split(start)
        except ValueError as exc:
            raise UsageError(f"--start {start!r}: {exc}") from None
        if not argv:
            raise UsageError("--start names no command")
    base_url = url or url_from_command(argv)
    if not base_url.startswith(("http://", "https://")):
        raise UsageError(f"--url {base_url!r} is not an http:// or https:// URL", hint="e.g. http://127.0.0.1:8000")
    prompt_name, prompt_text = resolve_prompt(prompt)
    served, origin, target, record = served_patch_set(
        ref, python=python, target_dir=target_dir, as_version=as_version, patch_set=patch_set
    )
    patches, build = record_facts(record)
    config = ServeConfig(
        base_url=base_url,
        model=model,
        engine_version=engine_version,
        patch_set=served,
        patch_set_from=origin,
        patches=patches if origin == "target" else None,
        engine_build=build,
        accept_baseline_mismatch=accept_baseline_mismatch,
        api_key=api_key,
        answers=answers,
        answers_extra_tokens=reasoning_budget,
        golden_path=Path(golden) if golden is not None else None,
        record_golden=record_golden,
        long_context=long_context,
        long_context_budget_s=long_context_budget,
        max_context=max_context,
        throughput=throughput,
        concurrency=parse_levels(concurrency) if isinstance(concurrency, str) else tuple(concurrency),
        requests_per_level=requests_per_level,
        prompt=prompt_text,
        prompt_name=prompt_name,
        shared_prompt=shared_prompt,
        max_tokens=max_tokens,
        stream=stream,
        baseline_dir=Path(baseline_dir) if baseline_dir is not None else None,
        update_baseline=update_baseline,
        threshold=threshold,
        request_timeout_s=timeout,
        level_timeout_s=level_timeout,
    )
    if argv:
        report = run_with_server(config, argv, ready_timeout_s=ready_timeout, progress=progress)
    else:
        report = run_validate(config, progress)
    warnings: list[str] = list(report.warnings)
    files = None
    if out is not None:
        written = write_outputs(report, Path(out))
        files = {"json": str(written.json_path), "png": str(written.png_path) if written.png_path else None}
        warnings += written.warnings
    # A server whose replies broke the protocol or a limit is the environment's fault, not a check's.
    code = EXIT_ENVIRONMENT if report.bad_reply_count else EXIT_OK if report.ok else EXIT_PATCH_FAILED
    return document(
        "validate",
        code,
        engine=ref.engine.name,
        url=report.base_url,
        started=bool(argv),
        patch_set_from=origin,
        target=target,
        report=report.to_json(),
        files=files,
        warnings=warnings,
    ), code


def served_patch_set(
    ref: EngineRef,
    *,
    python: str | None = None,
    target_dir: str | None = None,
    as_version: Version | None = None,
    patch_set: str | None = None,
) -> tuple[str, str, str | None, StateRecord | None]:
    """The patch set the server runs, for the baseline key: (value, where it came from, the tree read,
    its state record: what the report names of the patches and the build).

    --patch-set verbatim; else the state record of the engine's tree that --python or --target
    locate ("none" when nothing is applied to it); else "unknown"."""
    if patch_set is not None:
        if not patch_set.strip():
            raise UsageError("--patch-set is empty")
        return patch_set, "option", None, None
    if python is None and target_dir is None:
        return "unknown", "unknown", None, None
    from patchctl.tree.find import TargetSpec, find_target
    from patchctl.tree.status import status
    from patchctl.validate.baseline import applied_patch_set

    tree = find_target(ref, TargetSpec(python, target_dir, as_version))
    current = status(tree)
    # A tree pip has wiped or upgraded still has its old record, but runs none of those patches.
    record = current.record if current.state in ("intact", "modified") else None
    return applied_patch_set(record), "target", str(tree.root), record


# --- command line -----------------------------------------------------------------------------


def _concurrency(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        return parse_levels(value)
    except UsageError as exc:
        raise click.BadParameter(exc.message) from None


def _notify(text: str) -> None:
    """Progress lines on stderr, so that --json output stays one document."""
    click.echo(f"patchctl: {text}", err=True)


@patchctl_command(
    "validate",
    render=render,
    example=(
        "patchctl validate vllm --url http://127.0.0.1:8000          answers, throughput at 1/8/32, baseline",
        "patchctl validate vllm --url URL --concurrency 1 --requests 32   the single-request figure, steadier",
        "patchctl validate vllm --start 'vllm serve MODEL --port 8000' --python /opt/vllm/bin/python",
        "patchctl validate vllm --url URL --golden g.json --record-golden   record greedy outputs (known-good)",
        "patchctl validate vllm --url URL --golden g.json --no-throughput   compare with them token by token",
        "patchctl validate sglang --url http://127.0.0.1:30000 --update-baseline --out runs/today.json --json",
        "patchctl validate vllm --url URL --timeout 60 --level-timeout 600   no request past 60 s, no level past 10 min",
        "patchctl validate --compare before.json after.json --allow-different patch_set   after a patch change, no server",
        "patchctl validate vllm --url URL --long-context full --long-context-budget 1800   needles up to the limit, 30 min",
        "patchctl validate vllm --url URL --long-context off   short prompts only (no needles, no long greedy run)",
    ),
)
@click.argument("engine", metavar="ENGINE", required=False)
@click.option(
    "--demo",
    is_flag=True,
    help="Try validate without a GPU: start a tiny OpenAI-compatible demo server in-process (a reasoning "
    "model with fixed, right answers), validate it and stop it (ENGINE may be left out).",
)
@click.option("--url", metavar="URL", help="The running OpenAI-compatible server to validate.")
@click.option(
    "--start",
    metavar="CMD",
    help='Start this server command (e.g. "vllm serve MODEL --port 8000"), validate it, stop it. '
    "Its URL: --url, else the command's --host/--port.",
)
@click.option(
    "--ready-timeout", type=float, default=900.0, show_default=True, help="Seconds --start waits for the server to answer."
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="Deadline of each request to the server, connect to last byte (a stream that never ends, or "
    "only sends keep-alives, fails at it): e.g. --timeout 60. A server that answers no request "
    "within it is exit 3.",
)
@click.option(
    "--level-timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Deadline of each concurrency level: requests in flight then fail, the rest are not sent "
    "(default: the level's waves, requests / concurrency rounded up, times --timeout + 1 s), "
    "e.g. --level-timeout 600.",
)
@click.option("--model", help="Model to request (default: the first of /v1/models).")
@click.option("--engine-version", help="Engine version for the baseline key (default: the server's /version).")
@click.option("--api-key", envvar="OPENAI_API_KEY", help="Bearer token, if the server wants one.")
@click.option(
    "--python",
    "python",
    metavar="PATH",
    help="Interpreter whose environment holds the engine the server runs: what patchctl applied "
    "there names the baseline's patch set.",
)
@click.option(
    "--target",
    "target_dir",
    type=click.Path(file_okay=False),
    help="Or the engine's tree (a checkout or unpacked tree) the server runs.",
)
@as_version_option
@click.option(
    "--patch-set",
    metavar="TEXT",
    help="Name the patch set the server runs, for the baseline key (default: read from --python/"
    '--target; without them "unknown").',
)
@click.option(
    "--answers/--no-answers",
    default=True,
    show_default=True,
    help="Coherence: prompts with checkable answers (fact, arithmetic, counting, code).",
)
@click.option(
    "--reasoning-budget",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Extra max_tokens per answers prompt, for reasoning models that think first.",
)
@click.option(
    "--golden",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Coherence: compare greedy outputs token by token with this golden file.",
)
@click.option("--record-golden", is_flag=True, help="Record --golden from this (known-good) server instead.")
@click.option(
    "--long-context",
    type=click.Choice(["off", "quick", "full"]),
    default="quick",
    show_default=True,
    help="Long-context checks: needles in a haystack from 1k tokens (below a sparse top-k of 2048) up to the "
    "server's limit, at several depths, and with --golden a long document's greedy continuation. quick: "
    "1k/4k/16k/64k tokens, 3 depths, a 120 s budget; full: 1k to 256k, 5 depths, 1800 s. A length whose "
    "estimated time does not fit in the budget is skipped, and the report says so.",
)
@click.option(
    "--long-context-budget",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Time budget of the long-context checks (default: quick 120, full 1800), e.g. --long-context-budget 600.",
)
@click.option(
    "--max-context",
    type=click.IntRange(min=64),
    metavar="TOKENS",
    help="The server's context limit, where it does not say it (vLLM and SGLang do in /v1/models, llama-server "
    "in /props): the longest needle stays inside it. E.g. --max-context 32768.",
)
@click.option(
    "--throughput/--no-throughput",
    default=True,
    show_default=True,
    help="Throughput and latency at each concurrency level, and the baseline comparison.",
)
@click.option(
    "--concurrency", default="1,8,32", show_default=True, callback=_concurrency, help="Concurrency levels, comma-separated."
)
@click.option(
    "--requests",
    "requests_per_level",
    type=click.IntRange(min=1),
    help="Requests per concurrency level (default: 2 x concurrency, at least 16: enough for a median "
    "steady within the 5% threshold).",
)
@click.option(
    "--prompt",
    default="counting",
    show_default=True,
    metavar="counting|essay|FILE",
    help="Throughput prompt: counting (the field's deterministic \"Count from 1 to 50, writing each "
    'number on a new line."), essay (open-ended, what validate used before), or a text file '
    "whose content is the prompt. Every throughput request is at temperature 0, and starts with "
    'a tag of its own ("[3f9a1c-7] ") so a prefix cache cannot skip its prefill.',
)
@click.option(
    "--shared-prompt",
    is_flag=True,
    help="Send the prompt untagged, the same text in every throughput request: TTFT is then the "
    "server's prefix-cache hit (vLLM's prefix caching, SGLang's radix cache and llama.cpp reuse "
    "a prompt seen before), not a prefill.",
)
@click.option(
    "--max-tokens", type=click.IntRange(min=1), default=128, show_default=True, help="max_tokens of every throughput request."
)
@click.option(
    "--stream/--no-stream",
    default=True,
    show_default=True,
    help="--no-stream measures latency and tok/s only (no TTFT/TPOT/ITL).",
)
@click.option(
    "--baseline-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where per-deployment baselines live (default: patchctl's data dir).",
)
@click.option("--update-baseline", is_flag=True, help="Record this run as the deployment's baseline.")
@click.option(
    "--threshold",
    type=click.FloatRange(min=0),
    default=DEFAULT_THRESHOLD,
    show_default=True,
    help="Relative drop from the baseline that fails (0.05 = 5%).",
)
@click.option(
    "--accept-baseline-mismatch",
    is_flag=True,
    help="Compare with the deployment's baseline even when it measured something else (another engine build, "
    "GPU or max_model_len): without it that is exit 2, naming the field.",
)
@click.option(
    "--compare",
    nargs=2,
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="A.json B.json",
    help="No server: judge saved report B (--out, or --json) against A as a run is judged against its "
    "baseline (95% interval of the per-request medians' shift, then --threshold). Exit 1 on a regression, "
    "2 when they measured different things.",
)
@click.option(
    "--allow-different",
    multiple=True,
    metavar="FIELD",
    help="With --compare: the fields the comparison is about, allowed to differ (repeatable or comma-separated): "
    "model, patch_set, engine_version, engine_build, max_model_len, gpu_name, prompts, prompt, prompt_sha256, "
    "max_tokens, api, streamed, or all. E.g. --allow-different patch_set.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE.json",
    help="Also write the report as JSON here, and its latency/throughput plot next to it (.png; needs the plot extra).",
)
def command(engine: str | None, demo: bool, **options: Any) -> tuple[dict, int]:  # Any: click's values
    """Validate a running OpenAI-compatible server for ENGINE: answers, coherence, throughput.

    One of --url URL (a running server) or --start CMD (patchctl starts it, waits until it answers,
    validates it and stops it). Each deployment (model, engine version, patch set) keeps its own
    throughput baseline. Exit codes: 0 ok, 1 a check failed (a request past its deadline among them),
    2 bad input, 3 no server, it failed to start or never answered, or its replies broke the protocol
    or a limit (each named in the report). --demo validates a demo server it starts itself.
    --compare A.json B.json compares two saved reports instead, with no server.
    """
    compare = options.pop("compare", None)
    allow_different = options.pop("allow_different", ())
    if compare:
        return run_compare(engine, compare, allow_different, options)
    if allow_different:
        raise UsageError("--allow-different goes with --compare A.json B.json")
    if demo:
        return run_demo(engine, progress=_notify, **options)
    if engine is None:
        raise click.UsageError("Missing argument 'ENGINE'.")
    return run(engine, progress=_notify, **options)


def run_compare(
    engine: str | None, paths: Sequence[Path], allow_different: Sequence[str], options: dict[str, Any]
) -> tuple[dict, int]:
    """`--compare A B`: the two saved reports, no server; exit 1 when B regressed against A."""
    from patchctl.validate.compare import compare_reports

    if options.get("url") or options.get("start"):
        raise UsageError("--compare compares two saved reports: leave out --url and --start")
    result = compare_reports(Path(paths[0]), Path(paths[1]), options.get("threshold", DEFAULT_THRESHOLD), allow_different)
    warnings = [f"compared across a difference you allowed: {d.describe()}" for d in result.differences]
    if result.not_known:
        warnings.append(f"not checked, one of the reports does not say: {', '.join(result.not_known)}")
    code = EXIT_PATCH_FAILED if result.regressions else EXIT_OK
    return document("validate", code, engine=engine, compare=result.to_json(), warnings=warnings), code


def run_demo(engine: str | None, progress: Callable[[str], None] | None = None, **options: Any) -> tuple[dict, int]:
    """validate against the demo server (patchctl/validate/demo.py), started here and stopped after."""
    from patchctl.validate.demo import DemoServer

    if options.get("url") or options.get("start"):
        raise UsageError("--demo starts its own server: leave out --url and --start", hint="patchctl validate --demo")
    with DemoServer() as server:
        if progress is not None:
            progress(f"demo server (no GPU, fixed answers) at {server.base_url}")
        return run(engine or "vllm", **{**options, "url": server.base_url}, progress=progress)
