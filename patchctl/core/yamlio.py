"""Reading and writing YAML documents, and reading JSON ones, bounded (series, patch metadata, the matrix,
the config, the deployment file; index pages, records, journals, image manifests, cache documents):
safe loading only, through libyaml where it is installed (about 10x faster than the pure-Python loader),
and bounded. Any of these may come from someone else (a mirror, a registry, another user's cache or
tree), so both loaders refuse, as a parse error of their own kind would be refused:

- nesting deeper than MAX_DEPTH: json and both YAML composers recurse (a RecursionError, exit 4) and
  libyaml's C composer overflows the C stack (a segfault) at ~100,000 levels, so YAML is measured on
  its event stream (a loop, no recursion) before anything is composed;
- a NUL byte in any string (a path with one is a ValueError where it is used), a float that is not
  finite (YAML's .nan and .inf, JSON's NaN and 1e400: a wait that never ends) and an integer beyond
  64 bits (an OverflowError where a size or a time is used);
- in YAML, a key given twice in one mapping (the loaders keep the last one without a word), and an
  alias of a list or mapping (`*a`): nine lines of them expand to billions of values for whatever
  walks the document next (a schema check, json.dumps), or make one contain itself. patchctl writes
  none (dump_yaml copies a value used twice), and no document it reads needs one.

`BoundsError` is both a json.JSONDecodeError and a yaml.YAMLError, so every reader's existing
`except` for a malformed document names the file and gives its exit code: readers swap one call."""

from __future__ import annotations

import json
import math
from typing import Any

import yaml

from patchctl.core.errors import BoundsError

# libyaml when PyYAML was built with it: the same documents, ~8x faster to parse.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_RESOLVER = yaml.resolver.Resolver()  # the safe loader's implicit tags (int, bool, null, str, ...)

# The deepest document patchctl reads is the matrix, 7 levels; an OCI config ~4.
MAX_DEPTH = 64
INT_RANGE = 1 << 63  # |n| below this: a size, an offset or a time in seconds


def load_yaml(text: str | bytes) -> Any:
    """yaml.safe_load, through libyaml where available, within the bounds above (BoundsError). A
    YAMLError is raised by the pure-Python loader, whose messages show the offending line (libyaml's
    give only its position)."""
    try:
        _check_events(text)
        try:
            data = yaml.load(text, Loader=_SafeLoader)
        except yaml.YAMLError:
            if _SafeLoader is yaml.SafeLoader:
                raise
            data = yaml.load(text, Loader=yaml.SafeLoader)  # raises the same error, better worded
    except RecursionError:  # not reached within MAX_DEPTH; kept so that no input can make it a crash
        raise BoundsError(f"nested deeper than {MAX_DEPTH} levels") from None
    check_values(data)
    return data


def load_json(raw: str | bytes) -> Any:
    """json.loads within the bounds above (BoundsError, a JSONDecodeError). NaN and Infinity are
    refused as they are read, deep nesting as the parser recurses into it or right after."""
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise BoundsError(f"nested deeper than {MAX_DEPTH} levels") from None
    check_values(data)
    return data


def _no_constant(name: str) -> Any:
    raise BoundsError(f"{name} is not a number patchctl takes (finite numbers only)")


def _where(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out or "the document"


def check_values(data: Any) -> None:
    """BoundsError for a value past the bounds anywhere in a loaded document, naming where it is
    (`target`, `files[3].size`). A loop, not recursion; a list or mapping reached twice (YAML's
    anchors can share one, or make one contain itself) is looked at once."""
    seen: set[int] = set()
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if "\0" in value:
                raise BoundsError(f"{_where(path)}: a NUL byte in {value[:60]!r}", path)
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int):
            if not -INT_RANGE < value < INT_RANGE:
                raise BoundsError(f"{_where(path)}: {str(value)[:40]}… is out of range (64-bit integers only)", path)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise BoundsError(f"{_where(path)}: {value} is not a finite number", path)
        elif isinstance(value, (list, dict)):
            if id(value) in seen:
                continue
            seen.add(id(value))
            if len(path) >= MAX_DEPTH:
                raise BoundsError(f"{_where(path[:8])}…: nested deeper than {MAX_DEPTH} levels", path[:8])
            if isinstance(value, dict):
                for key, item in value.items():
                    stack.append((key, path))
                    stack.append((item, (*path, key)))
            else:
                stack.extend((item, (*path, index)) for index, item in enumerate(value))


def _check_events(text: str | bytes) -> None:
    """Nesting and duplicate keys, on the parser's event stream (libyaml's parser is a state machine:
    no recursion, and the first event past MAX_DEPTH stops it). A syntax error is left to the loader,
    whose message is better worded."""
    # One frame per open collection: [is a mapping, expecting a key, {key: its line}].
    frames: list[tuple[bool, list[bool], dict[tuple[str, str], int]]] = []
    collections: set[str] = set()  # anchors that name a list or mapping
    try:
        for event in yaml.parse(text, Loader=_SafeLoader):
            if isinstance(event, yaml.AliasEvent) and event.anchor in collections:
                line = event.start_mark.line + 1 if event.start_mark else 0
                raise BoundsError(
                    f"line {line}: *{event.anchor} repeats a list or mapping (a YAML alias): patchctl "
                    f"reads documents without them"
                )
            if isinstance(event, (yaml.NodeEvent, yaml.CollectionStartEvent)) and frames and frames[-1][0]:
                _, expecting, keys = frames[-1]
                if expecting[0] and isinstance(event, yaml.ScalarEvent) and event.value != "<<":
                    # what the key loads as: `a` and 'a' are one key, `1` and '1' two
                    key = (event.tag or _RESOLVER.resolve(yaml.ScalarNode, event.value, event.implicit), event.value)
                    line = event.start_mark.line + 1 if event.start_mark else 0
                    if key in keys:
                        raise BoundsError(
                            f"line {line}: key {event.value[:80]!r} given twice (first on line {keys[key]}): which one is meant?"
                        )
                    keys[key] = line
                expecting[0] = not expecting[0]
            if isinstance(event, yaml.CollectionStartEvent):
                if event.anchor is not None:
                    collections.add(event.anchor)
                if len(frames) >= MAX_DEPTH:
                    line = event.start_mark.line + 1 if event.start_mark else 0
                    raise BoundsError(f"line {line}: nested deeper than {MAX_DEPTH} levels")
                frames.append((isinstance(event, yaml.MappingStartEvent), [True], {}))
            elif isinstance(event, yaml.CollectionEndEvent):
                frames.pop()
    except yaml.YAMLError as exc:
        if isinstance(exc, BoundsError):
            raise
        return


class _Dumper(_SafeDumper):  # type: ignore[misc,valid-type]
    def ignore_aliases(self, data: Any) -> bool:
        return True  # a value used twice is written twice: load_yaml refuses aliases of lists and mappings


def dump_yaml(data: Any, **kwargs: Any) -> str:
    """yaml.safe_dump (same keyword arguments), through libyaml where available, writing no alias."""
    return yaml.dump(data, Dumper=_Dumper, **kwargs)


YAMLError = yaml.YAMLError
