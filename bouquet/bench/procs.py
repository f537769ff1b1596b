"""What the benchmark scripts read about server processes from /proc (Linux): CPU time and the
process tree, so that CPU per request can be reported beside requests per second."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterable


def cpu_seconds(pids: int | Iterable[int]) -> float:
    """User + system CPU seconds of the processes (every thread); one that has exited counts 0."""
    total = 0.0
    for pid in [pids] if isinstance(pids, int) else pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def tree_pids(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def child_pids(pid: int) -> list[int]:
    """The direct children of ``pid`` (empty when it has none or has exited)."""
    p = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in p.read_text().split()] if p.exists() else []


def rss_kb(pid: int) -> int:
    """Resident set size of a process in kB (``VmRSS`` of /proc/PID/status). Raises
    FileNotFoundError when it has exited, RuntimeError when it has no VmRSS (a zombie)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def terminate(proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """SIGTERM ``proc`` and wait; SIGKILL it when it is still running after ``grace_s`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
