"""JSON Schema documents for every file patchctl reads that a person, a crash or a full disk may have
damaged: the store (series.yaml, patch.yaml), a target's state record and journal, the download cache's
index pages, index responses and the matrix (the cache's binary files carry their own sha256 instead:
atomic.write_verified). One schema file per
document kind (`<name>.json` beside this module), validated with fastjsonschema, which compiles a schema
to plain Python: about 10 ms of import on the hot path, against 150-220 ms for pydantic or jsonschema
(`ensure` runs before every service start). Tests cross-check the schemas with the jsonschema package.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Callable
from importlib import resources
from typing import Any

from patchctl.errors import PatchctlError, StoreError


@functools.cache
def schema(name: str) -> dict[str, Any]:
    return json.loads(resources.files("patchctl.schemas").joinpath(f"{name}.json").read_text(encoding="utf-8"))


@functools.cache
def _validator(name: str) -> Callable[[Any], Any]:
    """The schema compiled to a Python function. Generating that code costs 6-20 ms a schema, and a
    `check` reads four kinds of document, `ensure` as many: the compiled code object is kept in the
    cache (<cache>/validators/, keyed by the schema's bytes, fastjsonschema's and Python's versions)
    and loads in a fraction of a millisecond. A cached file is checked by its sha256 before it is
    loaded; a damaged or unwritable cache only means generating the code again."""
    code = _cached_validator_code(name)
    namespace: dict[str, Any] = {}
    exec(code, namespace)  # noqa: S102  (code fastjsonschema generated from our own schema)
    return namespace["validate"]


def _cached_validator_code(name: str) -> Any:
    import hashlib
    import marshal
    import sys

    import fastjsonschema

    from patchctl import config
    from patchctl.atomic import read_verified, write_verified

    raw = resources.files("patchctl.schemas").joinpath(f"{name}.json").read_bytes()
    key = hashlib.sha256(b"\0".join((raw, fastjsonschema.VERSION.encode(), sys.version.encode()))).hexdigest()[:16]
    file = config.cache_dir() / "validators" / f"{name}-{key}.marshal"
    try:
        payload = read_verified(file)
    except OSError:  # e.g. an unreadable cache folder
        payload = None
    if payload:
        try:
            return marshal.loads(payload)
        except (EOFError, ValueError, TypeError):
            pass
    # compile_to_code is what fastjsonschema.compile executes, as text; `validate` is the root schema's function.
    code = compile(fastjsonschema.compile_to_code(schema(name)), f"<schema {name}>", "exec")
    try:
        write_verified(file, marshal.dumps(code))
    except OSError:
        pass  # a read-only or full cache: the next run generates the code again
    return code


def problem(name: str, document: Any) -> str | None:
    """What is wrong with `document` as a `name` document, in words; None when it is valid."""
    import fastjsonschema

    try:
        _validator(name)(document)
    except fastjsonschema.JsonSchemaException as exc:
        # fastjsonschema names the value by its path from `data`: "data.files[0].path must be string"
        # .message is set by the validation errors (JsonSchemaValueException) only; the base class
        # has no such attribute, and a broken schema raises a JsonSchemaDefinitionException without it.
        message: str = getattr(exc, "message", str(exc))
        if message.startswith("data."):
            return message[len("data."):]
        if message.startswith("data"):
            return "the document" + message[len("data"):]
        return message
    return None


def validate(name: str, document: Any, where: str, *, error: type[PatchctlError] = StoreError,
             hint: str | None = None) -> Any:
    """`document` unchanged when it is a valid `name` document; else `error("<where>: <what is wrong>")`."""
    wrong = problem(name, document)
    if wrong is not None:
        raise error(f"{where}: {wrong}", hint=hint)
    return document
