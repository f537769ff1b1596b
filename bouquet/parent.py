"""Child processes that die with the process that started them (Linux ``PR_SET_PDEATHSIG``).

Used by the replicas ``serve`` starts (server/__main__.py) and by its gateway workers
(gateway/factory.py), so that a launcher killed with SIGKILL leaves no process holding a GPU or
the gateway's port. The kernel sends SIGTERM, so each drains and stops as on a normal shutdown.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_PID_ENV = "BOUQUET_PARENT_PID"  # set by the launcher for the children that must die with it


def die_with_parent(expected_parent: int | None = None) -> None:
    """Ask for SIGTERM when the parent exits; exit now (code 1) when ``expected_parent`` (default:
    ``$BOUQUET_PARENT_PID``) is already gone, i.e. the parent died before this call. A no-op off
    Linux."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if expected_parent is None and os.environ.get(PARENT_PID_ENV, "").isdigit():
        expected_parent = int(os.environ[PARENT_PID_ENV])
    if expected_parent is not None and os.getppid() != expected_parent:
        sys.exit(1)  # orphaned before the request took effect: nobody will stop this process


def parent_alive() -> bool:
    """Whether the process named by ``PARENT_PID_ENV`` is still this process's parent (True
    when the variable is not set: nothing to outlive)."""
    expected = os.environ.get(PARENT_PID_ENV, "")
    return not expected.isdigit() or os.getppid() == int(expected)
