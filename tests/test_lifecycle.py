"""`bouquet serve` process lifecycle: no orphan server processes after SIGTERM or SIGKILL."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from helpers import BouquetProcess


def children(pid: int) -> list[int]:
    p = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in p.read_text().split()] if p.exists() else []


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.split(")")[-1].split()[0] != "Z"


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_orphans(sig):
    srv = BouquetProcess()
    try:
        kids = children(srv.proc.pid)
        assert kids, "the launcher should have started a server process"
        assert srv.embed("before stop").status_code == 200
        os.kill(srv.proc.pid, sig)
        srv.proc.wait(30)
        assert wait_gone(kids, 30) == []
    finally:
        srv.stop()
