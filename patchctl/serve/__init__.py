"""Serve tier of `patchctl smoke`: field validation against a running OpenAI-compatible engine.

Core API (returns data; rendering lives in `render`):
    run_serve_smoke(ServeConfig) -> ServeReport
    run_with_server(ServeConfig, command) -> ServeReport   # --start
"""
from .baseline import BaselineStore, Deployment, patch_set_digest
from .process import ServerProcess, ServerStartError
from .report import ServeReport
from .runner import ServeConfig, default_data_dir, run_serve_smoke, run_with_server

__all__ = [
    "BaselineStore",
    "Deployment",
    "ServeConfig",
    "ServeReport",
    "ServerProcess",
    "ServerStartError",
    "default_data_dir",
    "patch_set_digest",
    "run_serve_smoke",
    "run_with_server",
]
