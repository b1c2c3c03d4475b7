"""The serve tier of `patchctl validate`: checks a running OpenAI-compatible engine — coherence,
throughput and a per-deployment baseline — and returns data; the command line and the text live in
patchctl/cli/commands/validate.py.

    validation ServeConfig, run_validate(config), run_with_server(config, command) for --start
    report     ServeReport: the result, plain immutable data, JSON-able
    client     the timing OpenAI-compatible HTTP client; sse: the stream parser under it
    answers    coherence mode `answers`: prompts whose replies a program checks
    golden     coherence mode `golden`: greedy outputs compared token by token with a recorded run
    throughput, metrics   load at fixed concurrency; TTFT, TPOT, ITL, tok/s
    baseline   per-deployment baselines, the comparison, the patch-set digest
    process    start, watch and stop a server for --start
    outputs    what --out writes: the report as JSON and its plot (matplotlib, the plot extra)

Nothing is imported here, so `patchctl.validate.baseline` is importable without the HTTP client.
"""
