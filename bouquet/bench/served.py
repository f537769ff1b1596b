"""A `bouquet serve` child process for the tool suites (bouquet/bench/tools/): free port, the
caller's flags, ready once /health answers 200, gone when the tool exits (even by SIGKILL:
bouquet/parent.py)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bouquet.bench.procs import terminate


class Served:
    """``bouquet serve --port P --device DEVICE *args`` with ``env`` added to this environment;
    ``url`` its base URL. Raises RuntimeError
    with the server log's tail when it exits or is not healthy within ``timeout_s`` seconds."""

    def __init__(self, *args: str, device: str = "cpu", env: dict[str, str] | None = None,
                 timeout_s: float = 300.0) -> None:
        from bouquet.parent import PARENT_PID_ENV

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port: int = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._log_path = Path(tempfile.mkstemp(prefix="bouquet-bench-serve-", suffix=".log")[1])
        self._log = self._log_path.open("wb")
        cmd = [sys.executable, "-m", "bouquet", "serve", "--port", str(self.port), "--device", device, *args]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {}), PARENT_PID_ENV: str(os.getpid())})
        deadline = time.monotonic() + timeout_s
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail()  # before stop() removes the log
                self.stop()
                raise RuntimeError(f"bouquet serve {' '.join(args)} did not become healthy:\n{tail}")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def log_tail(self, chars: int = 3000) -> str:
        self._log.flush()
        return self._log_path.read_text(errors="replace")[-chars:]

    def vectors(self, texts: list[str]) -> np.ndarray:
        """float32 [len(texts), dim] from POST /v1/embeddings; raises RuntimeError on a non-200."""
        r = httpx.post(self.url + "/v1/embeddings", json={"input": texts}, timeout=120)
        if r.status_code != 200:
            raise RuntimeError(f"/v1/embeddings answered {r.status_code}: {r.text[:500]}")
        return np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s; removes the log."""
        terminate(self.proc)
        self._log.close()
        self._log_path.unlink(missing_ok=True)
