"""The gateway app as an import-string factory, for ``--gateway-workers N`` (uvicorn spawns
worker processes that import ``bouquet.gateway.factory:app_from_env`` and call it).

The launcher passes the whole ServeConfig, with the replica addresses already resolved into
``servers``, through one environment variable; it is read when a worker calls the factory, never
at import time. Every worker therefore talks to the same replicas. What it does not own: starting
replicas (launcher.py) or routes (app.py).
"""
from __future__ import annotations

import os

from bouquet.config import ConfigError, ServeConfig
from bouquet.gateway.front import ASGIApp

GATEWAY_CONFIG_ENV = "BOUQUET_GATEWAY_CONFIG"


def app_from_env() -> ASGIApp:
    """Build one worker's app from ``$BOUQUET_GATEWAY_CONFIG`` (ServeConfig JSON).

    Raises ConfigError when the variable is missing or names no replicas.
    """
    from bouquet.gateway.app import create_app
    from bouquet.modelspec import load_spec

    text = os.environ.get(GATEWAY_CONFIG_ENV)
    if not text:
        raise ConfigError(f"${GATEWAY_CONFIG_ENV} is not set; start gateway workers with `bouquet serve --gateway-workers N`")
    cfg = ServeConfig.from_json(text)
    if not cfg.servers:
        raise ConfigError(f"${GATEWAY_CONFIG_ENV} lists no replica addresses (servers)")
    spec = load_spec(cfg.model, cfg.served_model_name[0] if cfg.served_model_name else None)
    return create_app(cfg, spec)
