"""Coherence mode `golden`: greedy outputs of a known-good run, compared token by token.

A patch that shifts numerics changes greedy output somewhere even on a model too
small to answer questions; the first diverging position says where. Tokens come
from the server's logprobs when it gives them (vLLM, llama.cpp); otherwise the
text is compared character by character, and the result says which.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from patchctl.core.atomic import write_atomic
from patchctl.core.errors import HTTPError, UsageError
from patchctl.core.yamlio import load_json
from patchctl.validate import numerics as _numerics
from patchctl.validate.client import CHAT, COMPLETIONS, OpenAIClient

# Keys added to format 1 since: each entry's logprobs, the record's `long` (a long document's greedy
# continuation, longcontext.py): a file without them still loads, and is compared on text alone.
FORMAT = 1

# Raw continuations rather than chat: they work on base models and no chat
# template sits between the engine and the comparison.
DEFAULT_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "def fibonacci(n):\n",
    "1, 2, 3, 4, 5,",
    "Once upon a time, in a small village by the sea,",
)


class GoldenEntry(NamedTuple):
    prompt: str
    text: str
    tokens: tuple[str, ...] | None
    logprobs: tuple[float, ...] | None = None  # the top-1 logprob of each token, where the server gave them


class LongEntry(NamedTuple):
    """A long document's greedy continuation (longcontext.py): the document is not stored but
    rebuilt from (seed, chars) by haystack.document, and checked against its digest."""

    seed: int
    chars: int
    prompt_tokens: int  # as the recording server counted them
    prompt_sha256: str
    max_tokens: int
    text: str
    tokens: tuple[str, ...] | None
    logprobs: tuple[float, ...] | None


class GoldenRecord(NamedTuple):
    model: str
    engine_version: str
    api: str
    max_tokens: int
    entries: tuple[GoldenEntry, ...]
    long: LongEntry | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "format": FORMAT,
            "model": self.model,
            "engine_version": self.engine_version,
            "api": self.api,
            "max_tokens": self.max_tokens,
            "entries": [
                {
                    "prompt": e.prompt,
                    "text": e.text,
                    "tokens": list(e.tokens) if e.tokens is not None else None,
                    "logprobs": list(e.logprobs) if e.logprobs is not None else None,
                }
                for e in self.entries
            ],
        }
        if self.long is not None:
            out["long"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.long._asdict().items()}
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> GoldenRecord:
        """ValueError (naming what is wrong) for anything but a golden file this module wrote."""
        if not isinstance(obj, Mapping):
            raise ValueError(f"a golden file holds a JSON object, not {type(obj).__name__}")
        if obj.get("format") != FORMAT:
            raise ValueError(f"golden file format {obj.get('format')!r}, expected {FORMAT}")
        try:
            entries = obj["entries"]
            if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
                raise ValueError("'entries' is not a list of objects")
            record = cls(
                model=obj["model"],
                engine_version=obj["engine_version"],
                api=obj["api"],
                max_tokens=int(obj["max_tokens"]),
                entries=tuple(
                    GoldenEntry(e["prompt"], e["text"], _strings(e.get("tokens")), _numbers(e.get("logprobs"))) for e in entries
                ),
                long=_long(obj.get("long")),
            )
        except KeyError as exc:
            raise ValueError(f"no {exc} key") from None
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        texts = [record.model, record.engine_version] + [x for e in record.entries for x in (e.prompt, e.text)]
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("model, engine_version and every entry's prompt and text must be strings")
        if record.api not in (CHAT, COMPLETIONS):
            raise ValueError(f"api {record.api!r}, expected {CHAT!r} or {COMPLETIONS!r}")
        return record

    @property
    def has_logprobs(self) -> bool:
        return any(e.logprobs is not None for e in self.entries)

    def save(self, path: Path) -> Path:
        write_atomic(path, (json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n").encode())
        return path

    @classmethod
    def load(cls, path: Path) -> GoldenRecord:
        """The golden file at path; a file that is not one is bad input (UsageError, exit 2)."""
        try:
            return cls.from_json(load_json(Path(path).read_text()))
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
            raise UsageError(
                f"{path} is not a golden file: {exc}", hint="record one on a known-good engine with --golden PATH --record-golden"
            ) from None


def _strings(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise ValueError("tokens must be a list of strings")
    return tuple(value)


def _numbers(value: Any) -> tuple[float, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise ValueError("logprobs must be a list of numbers")
    return tuple(float(v) for v in value)


def _long(obj: Any) -> LongEntry | None:
    if obj is None:
        return None
    if not isinstance(obj, Mapping):
        raise ValueError("'long' is not an object")
    seed, chars, prompt_tokens, max_tokens = obj["seed"], obj["chars"], obj["prompt_tokens"], obj["max_tokens"]
    if not all(type(v) is int for v in (seed, chars, prompt_tokens, max_tokens)):
        raise ValueError("'long' needs integer seed, chars, prompt_tokens and max_tokens")
    if not isinstance(obj["prompt_sha256"], str) or not isinstance(obj["text"], str):
        raise ValueError("'long' needs string prompt_sha256 and text")
    tokens, logprobs = _strings(obj.get("tokens")), _numbers(obj.get("logprobs"))
    return LongEntry(seed, chars, prompt_tokens, obj["prompt_sha256"], max_tokens, obj["text"], tokens, logprobs)


class GoldenDiff(NamedTuple):
    prompt: str
    matched: bool
    unit: str  # "token" or "char"
    position: int | None  # first diverging index in `unit`s; None when matched
    context: str  # the common units just before the divergence
    expected: str  # what the golden run had from the divergence on (a few units)
    got: str
    expected_len: int
    got_len: int
    numerics: _numerics.Numerics | None = None  # the logprobs over the shared prefix (None in older reports)


def diff_from_json(obj: Mapping[str, Any]) -> GoldenDiff:
    """A GoldenDiff from a stored report (numerics absent in reports written before it was kept)."""
    num = obj.get("numerics")
    return GoldenDiff(**{**obj, "numerics": None if num is None else _numerics.Numerics(**num)})


def diff_entry(expected: GoldenEntry, got: GoldenEntry, context: int = 3) -> GoldenDiff:
    diff = _diff_text(expected, got, context)
    return diff._replace(numerics=_numerics.compare(expected.tokens, expected.logprobs, got.tokens, got.logprobs))


def _diff_text(expected: GoldenEntry, got: GoldenEntry, context: int) -> GoldenDiff:
    if expected.tokens is not None and got.tokens is not None:
        unit, a, b = "token", list(expected.tokens), list(got.tokens)
    else:
        unit, a, b = "char", list(expected.text), list(got.text)
    pos = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if pos is None and len(a) != len(b):
        pos = min(len(a), len(b))  # one output is a strict prefix of the other
    if pos is None:
        return GoldenDiff(expected.prompt, True, unit, None, "", "", "", len(a), len(b))
    window = context * (1 if unit == "token" else 8)
    return GoldenDiff(
        prompt=expected.prompt,
        matched=False,
        unit=unit,
        position=pos,
        context=_show(a[max(0, pos - window) : pos], unit),
        expected=_show(a[pos : pos + window], unit),
        got=_show(b[pos : pos + window], unit),
        expected_len=len(a),
        got_len=len(b),
    )


def _show(units: Sequence[str], unit: str) -> str:
    return repr(list(units)) if unit == "token" else repr("".join(units))


def generate(
    client: OpenAIClient,
    prompts: Sequence[str],
    max_tokens: int,
    api: str = COMPLETIONS,
    extra: Mapping[str, Any] | None = None,
) -> tuple[GoldenEntry, ...]:
    entries = []
    for k, prompt in enumerate(prompts, start=1):
        label = f"golden prompt {k}"
        try:
            reply = client.complete(api, prompt, max_tokens, temperature=0.0, logprobs=True, extra=extra, label=label)
        except HTTPError:
            # Some servers refuse logprobs; text is still comparable.
            reply = client.complete(api, prompt, max_tokens, temperature=0.0, extra=extra, label=label)
        entries.append(GoldenEntry(prompt, reply.content, reply.tokens, reply.logprobs))
    return tuple(entries)


def record(
    client: OpenAIClient,
    engine_version: str,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    max_tokens: int = 48,
    api: str = COMPLETIONS,
    extra: Mapping[str, Any] | None = None,
) -> GoldenRecord:
    """The short prompts' greedy outputs (longcontext.record_long adds the long document's)."""
    entries = generate(client, prompts, max_tokens, api, extra)
    return GoldenRecord(client.resolve_model(), engine_version, api, max_tokens, entries)


def compare(client: OpenAIClient, golden: GoldenRecord, extra: Mapping[str, Any] | None = None) -> tuple[GoldenDiff, ...]:
    """Replay the golden prompts with the golden settings and diff each output."""
    got = generate(client, [e.prompt for e in golden.entries], golden.max_tokens, golden.api, extra)
    return tuple(diff_entry(e, g) for e, g in zip(golden.entries, got, strict=True))
