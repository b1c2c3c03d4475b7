"""Deterministic long documents and needles, sized in the server's own tokens.

The text is made by a seeded generator (the same seed, the same text, on every machine and Python),
so a known-good run's long prompt can be rebuilt from (seed, chars) instead of stored. Sentences are
plain prose of a small vocabulary: no needle's word appears in the filler, so a needle's word can only be
found by reading the needle.

A length is in the server's tokens: its tokenizer counts them where it has an endpoint for it
(vLLM and SGLang `/tokenize`, llama.cpp's llama-server `/tokenize`, llama-cpp-python
`/extras/tokenize/count`); else the usage of one request calibrates characters per token.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any, NamedTuple

from patchctl.core.errors import BadServerReply, HTTPError, RequestFailed
from patchctl.validate.client import COMPLETIONS, OpenAIClient

_SUBJECTS = (
    "river garden market lantern harbor orchard meadow library bridge valley tower forest village mill "
    "quarry station chapel workshop granary lighthouse"
).split()
_VERBS = "crossed watched painted measured repaired visited described followed mapped planted swept guarded".split()
_ADJECTIVES = "quiet old narrow bright distant green small tall busy empty windy stony".split()
_PLACES = "north road east gate south wall west field upper lane lower square".split()
# A needle's key: names the filler never uses, so the question can only point at the needle.
# A needle's value: a word of its own, one or two tokens in most tokenizers (a number is copied digit
# by digit, and a small model drops a digit now and then at any length: that measures the model).
_VALUES = (
    "pineapple saxophone volcano umbrella dolphin telescope marmalade kangaroo harpsichord avalanche "
    "cinnamon lighthouse walrus trombone glacier porcupine chandelier meteorite pelican accordion"
).split()
_KEYS = "Aldebaran Montrose Kestrel Halvard Ostrava Quillon Veridian Tamsin Corvina Ashgrove Belmonte Draycott".split()

# The needle: a fact, then the document's last line starts to state it again; a base
# model completes it by copying (the completion-style prompt: no chat template, no instruction).
NEEDLE = "The secret word of the {key} is {value}."
QUESTION = "\n\nThe secret word of the {key} is"
CHARS_PER_TOKEN_GUESS = 4.0  # before anything was counted; English prose in most tokenizers


def _sentence(rng: random.Random) -> str:
    a, b = rng.choice(_ADJECTIVES), rng.choice(_ADJECTIVES)
    s1, s2 = rng.choice(_SUBJECTS), rng.choice(_SUBJECTS)
    return f"The {a} {s1} was {rng.choice(_VERBS)} by the {b} keeper of the {s2} near the {rng.choice(_PLACES)}."


def document(seed: int, chars: int) -> str:
    """`chars` characters (cut at a sentence) of seed's filler prose: the same on every run."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while True:
        s = _sentence(rng)
        if parts and size + 1 + len(s) > chars:
            return " ".join(parts)
        parts.append(s)
        size += len(s) + (1 if size else 0)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Needle(NamedTuple):
    key: str
    value: str
    prompt: str


def needle_prompt(filler: str, depth: float, seed: int) -> Needle:
    """The filler with a needle at `depth` (0: the start, 1: the end, at a sentence boundary) and
    the question after it. The key and the value (a word) come from the seed."""
    rng = random.Random(seed)
    key = f"{rng.choice(_KEYS)} vault"
    value = rng.choice(_VALUES)
    sentences = filler.split(". ")
    at = round(depth * len(sentences))
    needle = NEEDLE.format(key=key, value=value)
    head = ". ".join(sentences[:at])
    if head and not head.endswith("."):
        head += "."
    tail = ". ".join(sentences[at:])
    body = " ".join(p for p in (head, needle, tail) if p)
    return Needle(key, value, body + QUESTION.format(key=key))


class TokenCounter:
    """Counts text in the server's tokens: `count(text)` (None when it cannot), `method` says how
    (tokenize: the server's tokenizer; usage: calibrated from one request's prompt_tokens; guess)."""

    def __init__(self, client: OpenAIClient, extra: dict[str, Any] | None = None) -> None:
        self.client = client
        self.extra = extra or {}
        self.method = ""
        self._endpoint: Callable[[str], int | None] | None = None
        self.chars_per_token = CHARS_PER_TOKEN_GUESS

    def _tokenize(self, text: str) -> int | None:
        model = self.client.resolve_model()
        cap = 64 + 24 * len(text)  # a list of token ids is at most a few bytes per character
        # vLLM and SGLang read `prompt`, llama-server `content`; each ignores the other's key.
        status, obj = self.client.side_request("POST", "/tokenize", {"model": model, "prompt": text, "content": text}, cap)
        if status == 200 and isinstance(obj, dict):
            if type(obj.get("count")) is int:
                return int(obj["count"])
            if isinstance(obj.get("tokens"), list):
                return len(obj["tokens"])
        return None

    def _extras(self, text: str) -> int | None:
        status, obj = self.client.side_request("POST", "/extras/tokenize/count", {"input": text})
        if status == 200 and isinstance(obj, dict) and type(obj.get("count")) is int:
            return int(obj["count"])
        return None

    def _calibrate(self) -> None:
        """chars per token from the usage of one short request (a prefill of ~1,000 tokens)."""
        sample = document(0, 4000)
        try:
            reply = self.client.complete(COMPLETIONS, sample, 1, extra=self.extra, label="long context: calibration")
        except (HTTPError, BadServerReply, RequestFailed):
            return
        if reply.prompt_tokens and 1.0 <= len(sample) / reply.prompt_tokens <= 16.0:
            self.method = "usage"
            self._learn(sample, reply.prompt_tokens)

    def count(self, text: str) -> int | None:
        """The server's tokenizer's count of `text`; None where it has no endpoint for it (then
        chars_per_token, calibrated from one request's usage where it can be, sizes documents)."""
        if self._endpoint is None:
            answered = True
            for how in (self._tokenize, self._extras):
                try:
                    n = how(text)
                except (HTTPError, BadServerReply):
                    n = None
                except RequestFailed:  # no answer in time: asking again elsewhere would only wait again
                    n, answered = None, False
                if n is not None:
                    self._endpoint, self.method = how, "tokenize"
                    self._learn(text, n)
                    return n
                if not answered:
                    break
            self.method = "guess"
            self._endpoint = lambda _text: None
            if answered:
                self._calibrate()
            return None
        try:
            n = self._endpoint(text)
        except (HTTPError, BadServerReply, RequestFailed):
            n = None
        if n is not None:
            self._learn(text, n)
        return n

    def _learn(self, text: str, n: int) -> None:
        # A count no tokenizer gives (a server whose usage is a constant) would size documents absurdly.
        if n > 0 and 1.0 <= len(text) / n <= 16.0:
            self.chars_per_token = len(text) / n


def sized(counter: TokenCounter, make: Callable[[int], str], tokens: int, limit: int | None) -> tuple[str, int | None]:
    """The text make(chars) whose count is close to `tokens` (and never over `limit`): two
    corrections of chars from the server's counts. (text, its count; None when nothing counts)."""
    chars = int(tokens * counter.chars_per_token)
    text = make(chars)
    n = counter.count(text)
    if n is None:  # nothing counts: sized by the calibrated (or guessed) ratio, with 5% to spare
        chars = int(tokens * counter.chars_per_token * 0.95)
        return make(chars), None
    for _ in range(2):
        if n is None or n <= 0:
            return text, n
        ceiling = tokens if limit is None else min(tokens, limit)
        if abs(n - tokens) <= max(8, tokens // 50) and n <= ceiling:
            break
        chars = int(chars * min(tokens, ceiling) / n * (0.99 if n > ceiling else 1.0))
        text = make(chars)
        n = counter.count(text)
    return text, n
