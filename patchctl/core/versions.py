"""Version text read from the command line or from patch metadata, bounded before packaging sees it.

packaging turns each release segment into an int: a 5000-digit version makes Python refuse the
conversion with a ValueError that is not InvalidVersion, and a long one costs time. These raise
packaging's own InvalidVersion / InvalidSpecifier, so a caller's existing handling gives its usual
message and exit code.
"""

from __future__ import annotations

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

MAX_VERSION_CHARS = 128  # the longest release so far (a nightly with a local part) is under 50
MAX_SPECIFIER_CHARS = 1024


def parse_version(text: str) -> Version:
    """Version(text), refusing text longer than MAX_VERSION_CHARS."""
    if len(text) > MAX_VERSION_CHARS:
        raise InvalidVersion(f"a version of {len(text)} characters (at most {MAX_VERSION_CHARS})")
    return Version(text)


def parse_specifier_set(text: str) -> SpecifierSet:
    """SpecifierSet(text), refusing a set longer than MAX_SPECIFIER_CHARS or a version in it longer
    than MAX_VERSION_CHARS (packaging parses those only when a version is compared)."""
    if len(text) > MAX_SPECIFIER_CHARS:
        raise InvalidSpecifier(f"a specifier set of {len(text)} characters (at most {MAX_SPECIFIER_CHARS})")
    specifiers = SpecifierSet(text)
    for spec in specifiers:
        if len(spec.version) > MAX_VERSION_CHARS:
            raise InvalidSpecifier(
                f"a version of {len(spec.version)} characters in {str(spec)[:40]}... (at most {MAX_VERSION_CHARS})"
            )
    return specifiers
