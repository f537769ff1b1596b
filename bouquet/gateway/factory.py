"""The gateway app as an import-string factory, for ``--gateway-workers N`` (uvicorn spawns
worker processes that import ``bouquet.gateway.factory:app_from_env`` and call it).

The launcher passes each served model's ServeConfig (``ServeConfig.per_model``), with its replica
addresses already resolved into ``servers``, through one environment variable (a JSON list); it is
read when a worker calls the factory, never at import time. Every worker therefore serves every
model and talks to the same replicas, and drains on SIGTERM (drain.py). What it does not own: starting
replicas (launcher.py) or routes (app.py).
"""
from __future__ import annotations

import json
import logging
import os
from typing import Sequence

from bouquet.config import LOG_FORMAT, ConfigError, ServeConfig
from bouquet.gateway.front import ASGIApp

GATEWAY_CONFIG_ENV = "BOUQUET_GATEWAY_CONFIG"


def configs_to_json(models: Sequence[ServeConfig]) -> str:
    """The value of ``$BOUQUET_GATEWAY_CONFIG``: a JSON list of the models' configs, in order."""
    return json.dumps([json.loads(c.to_json()) for c in models])


def app_from_env() -> ASGIApp:
    """Build one worker's app from ``$BOUQUET_GATEWAY_CONFIG`` (``configs_to_json``).

    Raises ConfigError when the variable is missing or a model has no replicas.
    """
    from bouquet.gateway.app import create_app
    from bouquet.modelspec import load_spec

    text = os.environ.get(GATEWAY_CONFIG_ENV)
    if not text:
        raise ConfigError(f"${GATEWAY_CONFIG_ENV} is not set; start gateway workers with `bouquet serve --gateway-workers N`")
    cfgs = [ServeConfig.from_json(json.dumps(c)) for c in json.loads(text)]
    if not cfgs or not all(c.servers for c in cfgs):
        raise ConfigError(f"${GATEWAY_CONFIG_ENV} lists a model without replica addresses (servers)")
    # A spawned process starts without the launcher's logging: without this, the worker's own lines
    # (bouquet.access, refusals, the tokenizer chosen) below WARNING went nowhere.
    logging.basicConfig(level=cfgs[0].log_level.upper(), format=LOG_FORMAT)
    from bouquet.gateway.drain import DrainState
    from bouquet.parent import PARENT_PID_ENV, die_with_parent

    if PARENT_PID_ENV in os.environ:  # started by `bouquet serve`: a launcher killed with SIGKILL
        die_with_parent()              # must not leave workers holding the port

    models = [(c, load_spec(c.model, c.served_model_name[0] if c.served_model_name else None)) for c in cfgs]
    # SIGTERM from the supervisor drains this worker as it does the single-process gateway.
    return create_app(models, DrainState(timeout_s=cfgs[0].drain_timeout), take_signals=True)
