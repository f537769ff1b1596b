"""Which source a benchmark ran: the commit recorded next to the results."""
from __future__ import annotations

import subprocess
from pathlib import Path


def source_commit(repo: Path) -> str:
    """Short commit id of ``repo``. A tree copied to a GPU machine has no history of its own (or a
    stale one), so a ``COMMIT`` file at its root, written by bench/prepare_gpu_carry.py, wins."""
    stamp = repo / "COMMIT"
    if stamp.is_file():
        return stamp.read_text().strip()
    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
