"""`patchctl validate`'s text: the report a person reads (the --json document is the command's).

Apart from the command so that the command module keeps to its options and the document, and each stays
readable (the house keeps modules under 500 lines)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from patchctl.cli.commands.text import Literal, coloured, print_lines, table
from patchctl.cli.validate_compare_text import provenance_line

if TYPE_CHECKING:
    from patchctl.cli.commands.text import Console


def render(doc: dict, out: Console, err: Console) -> None:
    """The report: the single-request figure first, then coherence, throughput, baseline, the
    verdict and what --out wrote (warnings are the document's, on stderr)."""
    if doc.get("compare") is not None:
        from patchctl.cli.validate_compare_text import render_compare

        render_compare(doc, out)
        return
    rep = doc.get("report")
    if rep is None:
        return
    d = rep["deployment"]
    tp = rep.get("throughput")
    if tp is not None:  # the headline first: TTFT and the decode rate of one request at a time
        print_lines(out, [_single_request(tp)])
    print_lines(
        out,
        [
            f"validate {doc.get('engine')}: {rep['base_url']}",
            f"  model {d['model']}  engine {d['engine_version']}  patch set {d['patch_set']}",
        ]
        + [line for line in [provenance_line(rep.get("provenance"))] if line],
    )
    if rep.get("answers") is not None:
        t = table("coherence: answers", ["check", "result", "why", "reply"])
        for a in rep["answers"]:
            t.add_row(a["name"], _verdict(a["passed"], "PASS", "FAIL"), Literal(a["reason"]), Literal(a["reply_excerpt"][:60]))
        out.print(t)
    g = rep.get("golden")
    if g is not None:
        source = f", from {g['golden_model']} on {g['golden_engine_version']}" if g.get("golden_model") else ""
        title = f"coherence: golden ({g['mode']}, {g['path']}{source})"
        if g["diffs"]:
            t = table(title, ["prompt", "result", "first divergence", "logprobs"])
            for x in g["diffs"]:
                where = "-" if x["matched"] else f"{x['unit']} {x['position']}: expected {x['expected']} got {x['got']}"
                t.add_row(
                    Literal(repr(x["prompt"])[:40]), _verdict(x["matched"], "same", "DIVERGED"), Literal(where), _numerics(x)
                )
            out.print(t)
        else:
            print_lines(out, [title])
    if rep.get("long_context") is not None:
        _long_context(rep["long_context"], out)
    if tp is not None:
        how = "streaming" if tp["streamed"] else "non-streaming"
        prompt = f"{_prompt_phrase(tp)}, " if tp.get("prompt") else ""
        t = table(
            f"throughput ({how}, {tp['api']}, {prompt}max_tokens {tp['max_tokens']}; latencies are p50 ms; "
            "decode: per-request 1/TPOT p50; tok/s: output tokens over the level's wall time; spread: "
            "per-request tok/s IQR, ± its median's 95% interval; reasoning/answer: tokens, from chunks; client CPU: "
            "validate's own CPU time per output token)",
            [
                "concurrency",
                "requests",
                "failed",
                "TTFT",
                "TPOT",
                "decode tok/s",
                "ITL",
                "E2E",
                "tok/s",
                "req/s",
                "spread",
                "stream",
                "reasoning/answer",
                "client CPU",
                "tokens by",
            ],
        )
        for lv in tp["levels"]:
            t.add_row(
                str(lv["concurrency"]),
                str(lv["requests"]),
                str(lv["failed"]),
                _ms(lv["ttft_ms"]),
                _ms(lv["tpot_ms"]),
                _p50(lv.get("decode_tok_s")),
                _ms(lv["itl_ms"]),
                _ms(lv["e2e_ms"]),
                _num(lv["output_tok_s"]),
                _num(lv.get("request_throughput"), 2),
                _spread(lv.get("request_tok_s")),
                lv.get("stream") or "-",
                _split(lv),
                "-" if lv.get("client_cpu_ms_per_token") is None else f"{lv['client_cpu_ms_per_token'] * 1000:.0f} µs/tok",
                lv["token_count_method"],
            )
        out.print(t)
    b = rep.get("baseline")
    if b is not None:
        from patchctl.validate.baseline import BaselineCheck

        print_lines(
            out,
            [f"baseline ({b['status']}, {b['path']})"]
            + ["  " + BaselineCheck(**c).describe(b["threshold"]) for c in b["checks"]],
        )
    if rep.get("notes"):
        print_lines(out, ["notes:"] + [f"  {n}" for n in rep["notes"]])
    failures = rep.get("failures") or []
    if not failures:
        out.print(coloured(f"OK ({rep['duration_s']:.1f}s)", "green"))
    else:
        out.print(coloured(f"FAILED: {len(failures)} problem(s) ({rep['duration_s']:.1f}s)", "bold red"))
        print_lines(out, [f"  - {f}" for f in failures])
    print_lines(out, [f"wrote {path}" for path in (doc.get("files") or {}).values() if path])


def _numerics(diff: dict) -> str:
    """|Δlogprob| mean/max over the shared prefix, or why only the text was compared."""
    n = diff.get("numerics")
    if n is None or n["status"] != "compared":
        return "text only"
    if n["mean_abs"] is None:
        return "-"
    shown = f"{n['mean_abs']:.4f}/{n['max_abs']:.4f} over {n['compared']}"
    return shown if n["passed"] else coloured(f"MOVED {shown}", "bold red")


def _long_context(lc: dict, out: Console) -> None:
    """One row per length: the needles found at each depth, or why the length was skipped."""
    limit = f"limit {lc['limit']} tokens ({lc['limit_source']})" if lc["limit"] else "limit unknown"
    t = table(
        f"long context ({lc['mode']}, {lc['spent_s']:.0f} of {lc['budget_s']:g} s; {limit}; lengths by {lc['counted_by']})",
        ["tokens", "needles", *[f"depth {d:g}" for d in lc["depths"]], "time"],
    )
    for r in lc["lengths"]:
        if r["status"] != "covered":
            t.add_row(str(r["tokens"]), "skipped", Literal(r["reason"]), *[""] * (len(lc["depths"]) - 1), "-")
            continue
        by_depth = {n["depth"]: n for n in r["needles"]}
        cells = [
            "-" if (n := by_depth.get(d)) is None else _verdict(n["passed"], "found", f"MISSED {n['got']!r}"[:30])
            for d in lc["depths"]
        ]
        t.add_row(
            str(r["tokens"]),
            _verdict(r["passed"] == r["total"], f"{r['passed']}/{r['total']}", f"{r['passed']}/{r['total']}"),
            *cells,
            f"{r['seconds']:.1f}s",
        )
    out.print(t)
    g = lc.get("long_greedy")
    if g is not None:
        if g["status"] == "skipped":
            line = f"long greedy continuation: skipped: {g['reason']}"
        elif g["status"] == "recorded":
            line = (
                f"long greedy continuation: recorded into the golden file ({g['prompt_tokens']} prompt tokens, "
                f"{g['max_tokens']} out)"
            )
        else:
            d = g["diff"]
            text = "same" if d["matched"] else f"DIVERGED at {d['unit']} {d['position']}: expected {d['expected']} got {d['got']}"
            line = f"long greedy continuation ({g['prompt_tokens']} prompt tokens): {text}; logprobs {_numerics(d)}"
        print_lines(out, [line])


# How the throughput requests' prompts were sent (ThroughputReport.prompts); older reports: none.
_PROMPTS = {"unique": ", unique per request", "shared": ", shared by every request"}


def _prompt_phrase(tp: dict) -> str:
    """ "counting prompt, unique per request": the throughput prompt and how it was sent."""
    return f"{tp['prompt']} prompt{_PROMPTS.get(tp.get('prompts') or '', '')}"


_COUNTED = {"usage": "server usage", "chunks": "chunks (no server usage)", "mixed": "usage and chunks"}


def _single_request(tp: dict) -> str:
    """The figure people quote first, led by what a user feels: the time to the first token and the
    decode rate after it (1/TPOT); output tokens over the whole request, prefill included, after."""
    one = tp.get("single_request")
    if one is None:
        return "single request: not measured (--concurrency has no 1)"
    where = f"(concurrency 1, {one['requests']} requests" + (f", {_prompt_phrase(tp)}" if tp.get("prompt") else "")
    if one.get("token_count_method"):
        where += f", tokens by {_COUNTED.get(one['token_count_method'], one['token_count_method'])}"
    overall = f"{_num(one['output_tok_s'])} output tok/s over E2E"
    if one.get("latency_not_measured"):
        return f"single request: TTFT and decode rate not measured: {one['latency_not_measured']}; {overall} {where})"
    if one["ttft_ms"] is None:  # not streamed
        return f"single request: TTFT and decode rate not measured: not streamed; {overall} {where})"
    parts = [f"TTFT {one['ttft_ms']['p50']:.1f} ms"]
    if one.get("decode_tok_s") is not None:
        parts.append(f"decode {one['decode_tok_s']['p50']:.1f} tok/s")
    if one["tpot_ms"] is not None:
        parts.append(f"TPOT {one['tpot_ms']['p50']:.1f} ms")
    if one.get("itl_ms") is not None:
        parts.append(f"ITL {one['itl_ms']['p50']:.1f} ms")
    if one.get("e2e_ms") is not None:
        parts.append(f"E2E {one['e2e_ms']['p50']:.0f} ms")
    return f"single request: {', '.join(parts)}; {overall} {where}; p50)"


def _p50(spread: dict | None) -> str:
    return "-" if spread is None else f"{spread['p50']:.1f}"


def _split(lv: dict) -> str:
    """Reasoning and answer tokens, and how many requests ran out inside their reasoning."""
    if lv.get("reasoning_tokens") is None:
        return "-"
    cut = f" ({lv['ended_in_reasoning']} cut in reasoning)" if lv.get("ended_in_reasoning") else ""
    return f"{lv['reasoning_tokens']}/{lv['content_tokens']}{cut}"


def _spread(spread: dict | None) -> str:
    if spread is None or spread.get("iqr_pct") is None:
        return "-"
    ci = "" if spread.get("median_ci_pct") is None else f" ±{spread['median_ci_pct']:.1f}%"
    return f"{spread['iqr_pct']:.1f}%{ci}"


def _verdict(good: bool, yes: str, no: str) -> str:
    return coloured(yes, "green") if good else coloured(no, "bold red")


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ms(stats: dict | None) -> str:
    """p50 of a latency summary; "-" where it was not measured (never 0)."""
    return "-" if stats is None else f"{stats['p50']:.1f}"
