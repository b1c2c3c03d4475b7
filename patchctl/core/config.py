"""Where things live, and what the config file says (which index, which nightly source): flags >
environment > config file. pip's own settings come after these, read by the sources layer
(sources/fetch.resolve_index), which knows pip."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from patchctl.core.errors import UsageError
from patchctl.core.schemas import validate
from patchctl.core.yamlio import YAMLError, load_yaml

if TYPE_CHECKING:
    from types import ModuleType

# platformdirs is imported only when asked: with PATCHCTL_DATA_DIR (and
# the others) set, as a unit may do, `ensure` needs none of it.


def _platformdirs() -> ModuleType:
    import platformdirs

    return platformdirs


def config_file() -> Path:
    env = os.environ.get("PATCHCTL_CONFIG")
    return Path(env) if env else Path(_platformdirs().user_config_dir("patchctl")) / "config.yaml"


def cache_dir() -> Path:
    env = os.environ.get("PATCHCTL_CACHE_DIR")
    return Path(env) if env else Path(_platformdirs().user_cache_dir("patchctl"))


def data_dir() -> Path:
    env = os.environ.get("PATCHCTL_DATA_DIR")
    return Path(env) if env else Path(_platformdirs().user_data_dir("patchctl"))


def load_config() -> dict:
    """The config file, checked against patchctl/core/schemas/config.json ({} when there is none)."""
    path = config_file()
    if not path.is_file():
        return {}
    raw = path.read_bytes()
    try:
        data = load_yaml(raw.decode("utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise UsageError(f"config file {path} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})") from None
    except YAMLError as exc:
        raise UsageError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"config file {path} must hold a mapping")
    return validate(
        "config",
        data,
        f"config file {path}",
        error=UsageError,
        hint="keys: index_url, index_max_age, stores, nightly.<engine>.{url, ref, kind, variant} (docs/configuration.md)",
    )


class IndexChoice(NamedTuple):
    url: str
    origin: str  # where the URL came from, for error messages


def configured_index(flag: str | None = None) -> IndexChoice | None:
    """The index named by --index-url or the config file's index_url; None when neither names one."""
    if flag:
        return IndexChoice(flag.rstrip("/"), "--index-url")
    config = load_config()
    if config.get("index_url"):
        return IndexChoice(str(config["index_url"]).rstrip("/"), f"index_url in {config_file()}")
    return None


def nightly_override(engine: str) -> dict:
    """The config file's `nightly.<engine>` keys: kind, url, ref (git), variant (wheel index)."""
    return dict(((load_config().get("nightly") or {}).get(engine)) or {})
