"""The floor of an HTTP front end in Python: server CPU per request for a handler that reads a
small JSON body, parses it with orjson and answers a fixed ~2 KB reply, on one pinned core, under
16 keep-alive connections (bouquet/bench/loadgen.py). Candidates of issue 13: uvicorn + httptools
with a raw ASGI callable (what the gateway's front.py runs on), granian's RSGI and ASGI
interfaces. Needs ``pip install granian``; Linux with at least 2 cores.

    python bench/probes/http_frontends.py
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
REPLY = orjson.dumps({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": "AAAA" * 512}]})


async def asgi(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    orjson.loads(body)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(REPLY)).encode())]})
    await send({"type": "http.response.body", "body": REPLY})


async def rsgi(scope, proto):  # type: ignore[no-untyped-def]
    orjson.loads(await proto())
    proto.response_bytes(200, [("content-type", "application/json")], REPLY)


def main() -> None:
    from bouquet.bench.loadgen import post_request, run_clients
    from bouquet.bench.procs import cpu_seconds as cpu_s

    cases = {
        "uvicorn + httptools, raw ASGI": ["-m", "uvicorn", "http_frontends:asgi", "--loop", "uvloop", "--http", "httptools",
                                          "--no-access-log", "--log-level", "warning", "--port"],
        "granian, RSGI": ["-m", "granian", "--interface", "rsgi", "--loop", "uvloop", "--log-level", "warning",
                          "http_frontends:rsgi", "--port"],
        "granian, ASGI": ["-m", "granian", "--interface", "asgi", "--loop", "uvloop", "--log-level", "warning",
                          "http_frontends:asgi", "--port"],
    }
    for name, args in cases.items():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        p = subprocess.Popen([sys.executable, *args, str(port)], cwd=Path(__file__).parent)
        try:
            time.sleep(3)
            kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
            pids = [p.pid, *map(int, kids)]
            for pid in pids:
                for tid in os.listdir(f"/proc/{pid}/task"):
                    os.sched_setaffinity(int(tid), {0})
            os.sched_setaffinity(0, {1})
            raw = [post_request("127.0.0.1", port, "/v1/embeddings", b'{"input": "A man is playing a guitar."}')]
            t = time.monotonic() + 0.5
            with ThreadPoolExecutor(1) as ex:  # the load in a thread; the server's CPU read over the timed window
                fut = ex.submit(run_clients, "127.0.0.1", port, raw, 0, 16, 16, t, t + 1.0, t + 5.0)
                time.sleep(t + 1.0 - time.monotonic())
                c0 = cpu_s(pids)
                time.sleep(t + 5.0 - time.monotonic())
                c1 = cpu_s(pids)
                res = fut.result()
            n = len(res.latencies)
            print(f"{name}: {n / 4:,.0f} req/s, server CPU {(c1 - c0) / n * 1e6:.1f} µs/req "
                  f"(16 connections, server on one core)", flush=True)
        finally:
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
