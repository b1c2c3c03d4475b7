"""Errors the core raises; each carries the documented exit code the CLI returns.

0 ok · 1 a patch failed to apply (conflict, drift) · 2 usage or bad input · 3 environment
(network, permissions, missing engine, lock held).
"""
from __future__ import annotations

import re

EXIT_OK = 0
EXIT_PATCH_FAILED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3


class PatchctlError(Exception):
    exit_code = EXIT_USAGE
    kind = "error"

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(PatchctlError):
    exit_code = EXIT_USAGE
    kind = "usage"


class StoreError(PatchctlError):
    """The patch store is malformed or a patch was tampered with."""

    exit_code = EXIT_USAGE
    kind = "store"


class EnvironmentProblem(PatchctlError):
    exit_code = EXIT_ENVIRONMENT
    kind = "environment"


class NetworkError(EnvironmentProblem):
    kind = "network"


# What a resolver, socket or git says, in words a user can act on (the raw text stays available
# to anyone who runs the command with the network they have).
_PLAIN = (
    (re.compile(r"Could not resolve host|Failed to resolve|NameResolutionError|Name or service not known|"
                r"Temporary failure in name resolution|nodename nor servname"),
     "its host name does not resolve here (no DNS or no network)"),
    (re.compile(r"Connection refused"), "the connection was refused"),
    (re.compile(r"timed out|Timeout", re.I), "the connection timed out"),
    (re.compile(r"(?:CERTIFICATE_VERIFY_FAILED|SSL)"), "its TLS certificate could not be verified"),
)


def plain_network_reason(text: str) -> str:
    """'its host name does not resolve here ...' for a DNS failure, and so on; the text itself
    (shortened) when it is none of the usual ones."""
    for pattern, words in _PLAIN:
        if pattern.search(text):
            return words
    return text.strip().splitlines()[-1][:200] if text.strip() else "unknown network error"


class PatchFailed(PatchctlError):
    exit_code = EXIT_PATCH_FAILED
    kind = "patch-failed"
