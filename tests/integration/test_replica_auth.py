"""Issue 39, item 2: the API key guards every way in, not only the gateway's HTTP port.

A replica's gRPC port refuses Embed and Info without ``authorization: Bearer KEY`` metadata (health
stays open for probes); the Unix socket the gateway reaches its own replicas on is private (folder
0700, socket 0600); a replica started by ``serve`` gets the key through a pipe, never on its command
line or in its environment; ``bouquet server`` takes it from $BOUQUET_API_KEY or ``--api-key-file``
and ``serve --server`` sends it; ``/health`` tells a client without the key its status only; keys
that no client could send (whitespace, control characters) are refused at start with one line.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import grpc
import httpx
import numpy as np
import pytest

from bouquet.proto import bouquet_pb2 as pb
from bouquet.proto.rpc import HEALTH_SERVING, SERVICE
from helpers import BouquetProcess, GrpcServer, free_port, grpc_health, peak_rss_growth_mib

KEY = "sk-test-39"
AUTH = {"Authorization": f"Bearer {KEY}"}
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
GOOD = pb.EmbedRequest(input_ids=np.asarray([101, 7592, 102], "<i4").tobytes(), lengths=np.asarray([3], "<i4").tobytes())


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[BouquetProcess]:
    srv = BouquetProcess(env={"BOUQUET_API_KEY": KEY})
    yield srv
    srv.stop()


def replica_of(srv: BouquetProcess) -> dict:
    r = httpx.get(srv.url + "/health", headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["replicas"][0]


def call(address: str, method: str, metadata: tuple[tuple[str, str], ...]) -> object:
    req, rep = (GOOD, pb.EmbedReply) if method == "Embed" else (pb.InfoRequest(), pb.InfoReply)
    with grpc.insecure_channel(address) as ch:
        return ch.unary_unary(f"/{SERVICE}/{method}", request_serializer=type(req).SerializeToString,
                              response_deserializer=rep.FromString)(req, metadata=metadata, timeout=30)


def assert_needs_key(address: str, key: str) -> None:
    for method in ("Embed", "Info"):
        for md in ((), (("authorization", "Bearer wrong"),), (("authorization", key),), (("x-api-key", key),)):
            with pytest.raises(grpc.RpcError) as e:
                call(address, method, md)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, (method, md, e.value)
    for scheme in ("Bearer", "bearer", "BEARER"):  # the scheme in any case, as on the HTTP port
        reply = call(address, "Embed", (("authorization", f"{scheme} {key}"),))
        assert len(reply.output.data) == 384 * 4  # type: ignore[attr-defined]
    assert grpc_health(address) == HEALTH_SERVING  # probes carry no metadata


def test_health_without_the_key_tells_its_status_only(keyed_server):
    full = replica_of(keyed_server)
    assert full["pid"] > 0 and full["address"].startswith("127.0.0.1:")
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.get(keyed_server.url + "/health", headers=headers)
        assert r.status_code == 200 and r.json() == {"status": "ok"}, r.text
        assert full["address"] not in r.text and str(full["pid"]) not in r.text
        assert httpx.head(keyed_server.url + "/health", headers=headers).status_code == 200
        assert httpx.get(keyed_server.url + "/info", headers=headers).status_code == 401
    r = httpx.get(keyed_server.url + "/nothing-here", headers={"X-Request-Id": "rid-401"})
    assert r.status_code == 401 and r.headers["x-request-id"] == "rid-401"


def test_replica_grpc_port_needs_the_key(keyed_server):
    assert_needs_key(replica_of(keyed_server)["address"], KEY)
    assert httpx.post(keyed_server.url + "/v1/embeddings", json={"input": "still served"}, headers=AUTH).status_code == 200


def test_a_client_without_the_key_cannot_make_the_replica_take_in_its_request(keyed_server):
    """Refusals and health checks answer without reading the request: two 150 MiB Embed calls without
    the key and a 150 MiB health check left the replica's memory where it was (they raised its RSS by
    1.7 GiB for 3 × 300 MiB: grpc read each unary request whole, up to 512 MiB, before refusing it)."""
    replica = replica_of(keyed_server)
    msg = pb.EmbedRequest(input_ids=bytes(150 << 20)).SerializeToString()

    def send(method: str) -> grpc.StatusCode:
        with grpc.insecure_channel(replica["address"], options=[("grpc.max_send_message_length", 1 << 30)]) as ch:
            try:
                ch.unary_unary(method)(msg, timeout=60)
                return grpc.StatusCode.OK
            except grpc.RpcError as e:
                return e.code()

    def calls() -> list[grpc.StatusCode]:
        with ThreadPoolExecutor(3) as pool:
            return list(pool.map(send, [f"/{SERVICE}/Embed", f"/{SERVICE}/Embed", "/grpc.health.v1.Health/Check"]))

    codes, grew = peak_rss_growth_mib(replica["pid"], calls)
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 2 + [grpc.StatusCode.OK]
    assert grew < 100, f"replica RSS rose by {grew} MiB"
    assert call(replica["address"], "Embed", (("authorization", f"Bearer {KEY}"),)).num_tokens == 3  # type: ignore[attr-defined]


def test_replica_socket_is_private_and_its_key_came_through_a_pipe(keyed_server):
    pid = replica_of(keyed_server)["pid"]
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    sock = Path(argv[argv.index(b"--ipc-path") + 1].decode())
    assert sock.stat().st_mode & 0o777 == 0o600 and sock.parent.stat().st_mode & 0o777 == 0o700
    assert b"--api-key-stdin" in argv and KEY.encode() not in b" ".join(argv)
    assert KEY.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
    assert KEY not in keyed_server.log()


@pytest.mark.parametrize("command", ["serve", "server"])
@pytest.mark.parametrize("key", ["sk-test-123\n", " sk-test", "sk\ttest", "sk-test\x1b[0m", "sk-tést"])
def test_key_no_client_could_send_is_refused_at_start(command, key):
    r = subprocess.run([sys.executable, "-m", "bouquet", command, "--device", "cpu", "--port", str(free_port())],
                       env={**os.environ, "BOUQUET_API_KEY": key}, capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert "printable ASCII without spaces" in lines[0] and key.strip() not in lines[0], lines


def test_server_never_takes_the_key_on_its_command_line():
    shown = subprocess.run([sys.executable, "-m", "bouquet", "server", "-h"], capture_output=True, text=True, timeout=60)
    assert "--api-key-file" in shown.stdout and not re.search(r"--api-key(?!-file)", shown.stdout), shown.stdout


def test_standalone_server_key_from_a_file_and_serve_server_sends_it(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")  # `echo KEY > file`: the line break is dropped
    replica = GrpcServer("--api-key-file", str(key_file))
    gateways: list[BouquetProcess] = []
    try:
        assert_needs_key(replica.address, KEY)
        keyed = BouquetProcess("--server", replica.address, env={"BOUQUET_API_KEY": KEY})
        gateways.append(keyed)
        r = httpx.post(keyed.url + "/v1/embeddings", json={"input": "over gRPC"},
                       headers={**AUTH, "traceparent": TRACEPARENT, "X-Request-Id": "grpc-traced-1"}, timeout=60)
        assert r.status_code == 200 and r.headers["x-request-id"] == "grpc-traced-1", r.text
        # the trace context reached the remote replica as gRPC metadata, and its log shows it
        log = Path(replica._log.name).read_text()
        assert f"traceparent={TRACEPARENT} request_id=grpc-traced-1 sequences=1: ok" in log, log[-2000:]
        keyless = BouquetProcess("--server", replica.address, wait_for=(503,))
        gateways.append(keyless)
        health = httpx.get(keyless.url + "/health").json()
        assert "UNAUTHENTICATED" in health["replicas"][0]["error"], health
        assert httpx.post(keyless.url + "/v1/embeddings", json={"input": "x"}).status_code == 503
    finally:
        for g in gateways:
            g.stop()
        replica.stop()
    env_replica = GrpcServer(env={"BOUQUET_API_KEY": KEY})
    try:
        assert_needs_key(env_replica.address, KEY)
    finally:
        env_replica.stop()
