"""Helpers for the reliability tests (issue 8): error-shape checks; RSS reads and child processes
come from bouquet/bench/procs.py (the load and soak clients read them too)."""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bouquet.bench.procs import child_pids, rss_kb  # noqa: F401  (the tests import them from here)

REPO = Path(__file__).resolve().parents[1]


def openai_error(r: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """Assert ``r`` is an OpenAI-shaped error with this status (and param / code when given)."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def tei_error(r: httpx.Response, status: int) -> dict[str, Any]:
    """Assert ``r`` is a TEI-shaped error (``{"error", "error_type"}``) with this status."""
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error", "error_type"} and body["error"], body
    return body


def any_error_shape(path: str, body: Any) -> None:
    """An error body in the documented shape of the route family of ``path``: OpenAI on /v1/*,
    Cohere on /v2/*, TEI elsewhere."""
    if path.startswith("/v2/"):
        assert set(body) == {"message"} and body["message"], body
    elif path.startswith("/v1/"):
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    else:
        assert set(body) == {"error", "error_type"} and body["error"], body


def decode_b64(s: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype="<f4")
