"""Which source a benchmark ran: the commit recorded next to the results."""
from __future__ import annotations

import subprocess
from pathlib import Path


def source_commit(repo: Path) -> str:
    """Short commit id of ``repo`` (``git rev-parse --short HEAD``), or "unknown" outside a git
    checkout (a tree copied without its history: pass ``--commit`` to ``bouquet bench`` there)."""
    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
