"""Reading and writing YAML documents (series, patch metadata, engines.yaml, the matrix, the config):
safe loading only, through libyaml where it is installed (about 10x faster than the pure-Python loader)."""
from __future__ import annotations

from typing import Any

import yaml

# libyaml when PyYAML was built with it: the same documents, ~8x faster to parse.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_SafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def load_yaml(text: str | bytes) -> Any:
    """yaml.safe_load, through libyaml where available. A YAMLError is raised by the pure-Python
    loader, whose messages show the offending line (libyaml's give only its position)."""
    try:
        return yaml.load(text, Loader=_SafeLoader)
    except yaml.YAMLError:
        if _SafeLoader is yaml.SafeLoader:
            raise
        return yaml.load(text, Loader=yaml.SafeLoader)  # raises the same error, better worded


def dump_yaml(data: Any, **kwargs: Any) -> str:
    """yaml.safe_dump (same keyword arguments), through libyaml where available."""
    return yaml.dump(data, Dumper=_SafeDumper, **kwargs)


YAMLError = yaml.YAMLError
