"""Errors the core raises; each carries the documented exit code the CLI returns.

0 ok · 1 a patch failed to apply (conflict, drift) · 2 usage or bad input · 3 environment
(network, permissions, missing engine, lock held).
"""
from __future__ import annotations

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


class PatchFailed(PatchctlError):
    exit_code = EXIT_PATCH_FAILED
    kind = "patch-failed"
