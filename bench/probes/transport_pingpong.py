"""Round trip of one 100-byte message between two processes: ZeroMQ DEALER/ROUTER over ``ipc://``
against a plain Unix socket (blocking calls, no event loop): the transport choice of
bouquet/proto/ipc.py. Needs ``pip install pyzmq``.

    python bench/probes/transport_pingpong.py          # prints µs per round trip and client CPU
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

N = 5000


def serve(kind: str, path: str) -> None:
    if kind == "zmq":
        import zmq

        s = zmq.Context(1).socket(zmq.ROUTER)
        s.bind(f"ipc://{path}")
        while True:
            s.send_multipart(s.recv_multipart())
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)
    c, _ = srv.accept()
    while data := c.recv(65536):
        c.sendall(data)


def client(kind: str, path: str) -> tuple[float, float]:
    if kind == "zmq":
        import zmq

        s = zmq.Context(1).socket(zmq.DEALER)
        s.connect(f"ipc://{path}")
        send, recv = s.send, s.recv
    else:
        c = socket.socket(socket.AF_UNIX)
        for _ in range(100):
            try:
                c.connect(path)
                break
            except OSError:
                time.sleep(0.05)
        send, recv = c.sendall, lambda: c.recv(65536)
    msg = b"x" * 100
    for _ in range(500):
        send(msg)
        recv()
    t, cpu = time.perf_counter(), time.process_time()
    for _ in range(N):
        send(msg)
        recv()
    return (time.perf_counter() - t) / N * 1e6, (time.process_time() - cpu) / N * 1e6


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3])
        return
    for kind in ("zmq", "unix"):
        path = os.path.join(tempfile.mkdtemp(), "pp.sock")
        p = subprocess.Popen([sys.executable, __file__, "--serve", kind, path])
        try:
            time.sleep(0.5)
            rtt, cpu = client(kind, path)
            print(f"{kind}: round trip {rtt:.1f} µs, client CPU {cpu:.1f} µs")
        finally:
            p.kill()


if __name__ == "__main__":
    main()
