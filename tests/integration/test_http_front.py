"""The HTTP front end's limits and request semantics (issue 39 item 1), on raw sockets against a
real `bouquet serve --engine noop` whose deadlines are set small: slow clients (silent, slow head,
slow body, pauses), head size and field count, the connection cap, and each MUST of RFC 9112 /
RFC 9110 the front end touches. After every bad client a normal request is still served."""
from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import orjson
import pytest

from helpers import BouquetProcess
from reliability import any_error_shape, rss_kb

# one gateway process (the RSS and the cap are per process); connect-idle 1 s, head 1.5 s, body 2 s,
# pauses 1 s, 40 connections; sizes at their defaults
FLAGS = ("--engine", "noop", "--gateway-workers", "1", "--timeout-connect-idle", "1", "--timeout-headers", "1.5", "--timeout-body", "2",
         "--timeout-read-gap", "1", "--max-connections", "40")
HEALTH = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"
EMBED = b'{"input": "hi"}'


@pytest.fixture(scope="module")
def front() -> Iterator[BouquetProcess]:
    srv = BouquetProcess(*FLAGS)
    yield srv
    srv.stop()


def connect(srv: BouquetProcess, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)


_UNREAD: weakref.WeakKeyDictionary[socket.socket, bytes] = weakref.WeakKeyDictionary()  # read past a response


def read_reply(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The next response on ``s``: status, headers (lowercase names), body (by Content-Length).
    Bytes read past it (pipelined responses) are kept for the next call."""
    data = _UNREAD.pop(s, b"")
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"connection closed without an answer; got {data[:200]!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
    n = int(headers.get("content-length", "0"))
    while len(rest) < n:
        chunk = s.recv(65536)
        assert chunk, "connection closed inside a body"
        rest += chunk
    _UNREAD[s] = rest[n:]
    return int(lines[0].split()[1]), headers, rest[:n]


def closed_by_server(s: socket.socket, within: float) -> bool:
    """True when the server closes ``s`` (EOF) within ``within`` s, reading and dropping any data."""
    s.settimeout(within)
    _UNREAD.pop(s, None)
    try:
        while s.recv(65536):
            pass
        return True
    except socket.timeout:
        return False


def refused(s: socket.socket, status: int, code: str, path: str = "/health") -> dict:
    """Assert the next answer on ``s`` is the API's JSON error ``status`` / ``code``, with
    ``Connection: close``, and that the server then closes the connection."""
    got, headers, body = read_reply(s)
    obj = orjson.loads(body)
    assert got == status, (got, obj)
    any_error_shape(path, obj)
    assert headers["x-request-id"], headers
    if path.startswith("/v1/"):
        assert obj["error"]["code"] == code, obj
    assert headers["connection"] == "close" and closed_by_server(s, 5), headers
    return obj


def served(srv: BouquetProcess) -> None:
    """A normal request on a new connection still gets its 200."""
    with connect(srv) as s:
        s.sendall(HEALTH)
        assert read_reply(s)[0] == 200


def post(path: str, body: bytes, length: int | None = None, extra: bytes = b"") -> bytes:
    n = len(body) if length is None else length
    return b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n" % (
        path.encode(), extra, n) + body


# ---- slow clients ---------------------------------------------------------------------------
def test_a_silent_connection_is_closed_unanswered(front):
    with connect(front) as s:
        t0 = time.monotonic()
        s.settimeout(6)
        assert s.recv(1024) == b""  # closed, no answer
        assert 0.8 < time.monotonic() - t0 < 4
    served(front)


@pytest.mark.parametrize("kind", ["head_drip", "head_pause", "body_drip", "body_pause"])
def test_slow_requests_get_408_and_close(front, kind):
    """A header line every 0.5 s: the 1.5 s head deadline; half a head, then nothing: the 1 s
    pause limit; a body byte every 0.5 s: the 2 s body deadline; half a body, then nothing."""
    head = b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    flag, lo, hi = {"head_drip": ("--timeout-headers", 1.3, 4), "head_pause": ("--timeout-read-gap", 0.8, 3.5),
                    "body_drip": ("--timeout-body", 1.8, 4.5), "body_pause": ("--timeout-read-gap", 0.8, 3.5)}[kind]
    with connect(front) as s:
        t0 = time.monotonic()
        s.sendall(head if kind.startswith("head") else head + b"Content-Length: 100\r\n\r\n" + EMBED[:5])
        if kind.endswith("drip"):
            def drip() -> None:
                for i in range(20):
                    time.sleep(0.5)
                    try:
                        s.sendall(b"X-Line-%d: v\r\n" % i if kind == "head_drip" else b" ")
                    except OSError:
                        return  # the server answered and closed
            threading.Thread(target=drip, daemon=True).start()
        err = refused(s, 408, "request_timeout", "/v1/embeddings")
        assert flag in err["error"]["message"], err
        assert lo < time.monotonic() - t0 < hi
    served(front)


def test_keep_alive_and_steady_slow_clients_are_served(front):
    """The connect-idle deadline is for a connection's first byte only: a keep-alive connection
    idle for longer still serves its next request; a head and a body sent in pieces 0.3 s apart
    (inside every deadline) are served."""
    with connect(front) as s:
        s.sendall(HEALTH)
        assert read_reply(s)[0] == 200
        time.sleep(1.5)
        req = post("/v1/embeddings", EMBED)
        for i in range(0, len(req), 30):
            s.sendall(req[i:i + 30])
            time.sleep(0.3)
        status, _, body = read_reply(s)
        assert status == 200 and len(orjson.loads(body)["data"][0]["embedding"]) == 384


def test_pipelined_requests_keep_their_answers(front):
    """Two requests and then half a head on one connection: 200, 200, then the 408 once the
    pause limit passes; 3,000 pipelined requests in one send are all answered 200 (the gateway
    stops reading while they wait, and that time is not held against the client)."""
    good = post("/v1/embeddings", EMBED)
    with connect(front) as s:
        s.sendall(good + good + b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\n")
        assert [read_reply(s)[0] for _ in range(2)] == [200, 200]
        refused(s, 408, "request_timeout", "/v1/embeddings")
    with connect(front, timeout=60) as s:
        sender = threading.Thread(target=s.sendall, args=(good * 3000,))
        sender.start()
        assert [read_reply(s)[0] for _ in range(3000)] == [200] * 3000
        sender.join()


def test_idle_connections_and_the_connection_cap(front):
    """300 connections that send nothing: past the cap (40) a new client is answered 503 with
    Retry-After, not reset; the idle ones are closed after the 1 s connect-idle deadline, and
    then new clients are served."""
    idle = [connect(front) for _ in range(300)]
    try:
        with connect(front) as s:
            s.sendall(HEALTH)
            got, headers, body = read_reply(s)
            assert got == 503 and headers["retry-after"] == "1", (got, body)
            assert orjson.loads(body)["error"] and "--max-connections" in orjson.loads(body)["error"]
        assert "past --max-connections 40" in front.log()  # the operator hears of it
        deadline = time.monotonic() + 6
        assert all(closed_by_server(c, max(0.1, deadline - time.monotonic())) for c in idle)
    finally:
        for c in idle:
            c.close()
    time.sleep(2.5)  # the 503's connection lingers up to 2 s
    served(front)


# ---- head size and field count --------------------------------------------------------------
@pytest.mark.parametrize("kind", ["one_mib_field", "fields_50000", "fields_101", "one_mib_target", "chunked_trailer",
                                  "chunked_trailer_one_read"])
def test_oversized_heads_get_431_or_414(front, kind):
    big = b"a" * (1 << 20)
    payload = {"one_mib_field": b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + big + b"\r\n\r\n",
               "fields_50000": b"GET /health HTTP/1.1\r\nHost: t\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(50000))
               + b"\r\n",
               "fields_101": b"GET /health HTTP/1.1\r\nHost: t\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(100)) + b"\r\n",
               "one_mib_target": b"GET /health?" + big + b" HTTP/1.1\r\nHost: t\r\n\r\n",
               "chunked_trailer": b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                                  b"f\r\n" + EMBED + b"\r\n0\r\nX-Trailer: " + big + b"\r\n\r\n",
               # 80 KB of trailer fields sent with the head in one write (served: the read that
               # brought the head went to the parser uncounted, and so did the one ending the body)
               "chunked_trailer_one_read": b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                                           b"f\r\n" + EMBED + b"\r\n0\r\n"
                                           + b"".join(b"X-T%d: %s\r\n" % (i, b"b" * 10000) for i in range(8)) + b"\r\n"}[kind]
    count = (431, "request_header_fields_too_large", "--max-header-count")
    status, code, flag = {"one_mib_target": (414, "uri_too_long", "--max-header-bytes"), "fields_50000": count,
                          "fields_101": count}.get(
        kind, (431, "request_header_fields_too_large", "--max-header-bytes"))
    path = "/v1/embeddings" if kind.startswith("chunked_trailer") else "/health"
    with connect(front) as s:
        s.sendall(payload)
        err = refused(s, status, code, path)
        assert flag in str(err), err
    served(front)


def test_heads_at_the_limits_are_served(front):
    fields = b"".join(b"X-%d: v\r\n" % i for i in range(99))  # + Host = 100 field lines
    with connect(front) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n" + fields + b"\r\n")
        assert read_reply(s)[0] == 200
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 65000 + b"\r\n\r\n")  # 65,055 of 65,536 bytes
        assert read_reply(s)[0] == 200


def test_unfinished_64_mib_heads_keep_the_gateway_flat(front):
    """4 connections each send a 64 MiB header field that never ends: each is answered 431 after
    64 KiB, the rest is read and dropped, and the gateway's RSS stays flat (it grew 130 → 384 MB
    when the parser buffered every byte)."""
    for _ in range(3):
        served(front)
    pid = front.proc.pid  # the gateway runs in the launcher process (one gateway worker)
    before = rss_kb(pid)
    samples = [before]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(rss_kb(pid))
            time.sleep(0.02)

    def client() -> tuple[int, int | None]:
        chunk, sent = b"a" * 65536, 0
        with connect(front) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: ")
            try:
                while sent < 64 << 20:
                    s.sendall(chunk)
                    sent += len(chunk)
                return sent, read_reply(s)[0]
            except OSError:  # the server closed first (its linger ended): no status to read
                return sent, None

    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: client(), range(4)))
    finally:
        stop.set()
        watcher.join()
    growth_mb = (max(samples) - before) / 1024
    print("RSS", before, max(samples), len(samples), results)
    assert growth_mb < 24, (before, max(samples), results)
    assert sum(1 for _, status in results if status == 431) >= 3, results
    assert all(status in (431, None) for _, status in results), results
    served(front)


# ---- request semantics: RFC 9112 / RFC 9110 -------------------------------------------------
def get(target: bytes, version: bytes = b"HTTP/1.1", headers: bytes = b"Host: t\r\n", method: bytes = b"GET") -> bytes:
    return method + b" " + target + b" " + version + b"\r\n" + headers + b"\r\n"


def chunked(codings: bytes, body: bytes = b"f\r\n" + EMBED + b"\r\n0\r\n\r\n", version: bytes = b"HTTP/1.1") -> bytes:
    """A POST /v1/embeddings with ``Transfer-Encoding: codings`` and no Content-Length."""
    return b"POST /v1/embeddings " + version + b"\r\nHost: t\r\nTransfer-Encoding: " + codings + b"\r\n\r\n" + body


SEMANTICS = [  # (what, payload, status); every refusal closes the connection
    ("HTTP/2.0 in an HTTP/1 request line", get(b"/health", b"HTTP/2.0"), 505),
    ("HTTP/3.0", get(b"/health", b"HTTP/3.0"), 505),
    ("HTTP/0.9: no version", b"GET /health\r\n\r\n", 505),
    ("the HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
    ("HTTP/1.2 is served as 1.1", get(b"/health", b"HTTP/1.2"), 200),
    ("HTTP/1.0 without Host", get(b"/health", b"HTTP/1.0", b""), 200),
    ("HTTP/1.1 without Host", get(b"/health", headers=b""), 400),
    ("two Host lines", get(b"/health", headers=b"Host: a\r\nHost: a\r\n"), 400),
    ("Host with a space", get(b"/health", headers=b"Host: a b\r\n"), 400),
    ("Host with userinfo", get(b"/health", headers=b"Host: u@a\r\n"), 400),
    ("Host with a bad port", get(b"/health", headers=b"Host: a:8x\r\n"), 400),
    ("empty Host (allowed)", get(b"/health", headers=b"Host:\r\n"), 200),
    ("Host [::1]:8000", get(b"/health", headers=b"Host: [::1]:8000\r\n"), 200),
    ("absolute-form", get(b"http://x.example/health", headers=b"Host: other\r\n"), 200),
    ("absolute-form without Host", get(b"http://x.example/health", headers=b""), 400),
    ("absolute-form with userinfo", get(b"http://u@x.example/health"), 400),
    ("absolute-form without host", get(b"http:///health"), 400),
    ("absolute-form ftp", get(b"ftp://x.example/health"), 400),
    ("asterisk-form with GET", get(b"*"), 400),
    ("asterisk-form with OPTIONS", get(b"*", method=b"OPTIONS"), 200),
    ("authority-form with GET", get(b"x.example:80"), 400),
    ("CONNECT (authority-form)", get(b"x.example:80", method=b"CONNECT", headers=b"Host: x.example:80\r\n"), 501),
    ("a relative target", get(b"health"), 400),
    ("a fragment", get(b"/health#top"), 400),
    ("bad percent-encoding", get(b"/he%zzalth"), 400),
    ("a '|' in the path", get(b"/health|x"), 400),
    ("a non-ASCII target", get(b"/h\xc3\xa9alth"), 400),
    ("percent-encoded path (allowed)", get(b"/%68ealth?x=%20"), 200),
    ("unknown method", get(b"/health", method=b"FOO"), 501),
    ("lower-case method", get(b"/health", method=b"get"), 501),
    ("known method, not allowed here", get(b"/health", method=b"PROPFIND"), 405),
    ("not HTTP at all", b"NOT HTTP AT ALL\r\n\r\n", 400),
    ("whitespace before the colon", get(b"/health", headers=b"Host : t\r\n"), 400),
    ("obs-fold", get(b"/health", headers=b"Host: t\r\nX-A: b\r\n c\r\n"), 400),
    ("whitespace before the first field", get(b"/health", headers=b" Host: t\r\n"), 400),
    ("bare CR in a value", get(b"/health", headers=b"Host: t\r\nX-A: b\rc\r\n"), 400),
    ("NUL in a value", get(b"/health", headers=b"Host: t\r\nX-A: b\x00c\r\n"), 400),
    ("empty field name", get(b"/health", headers=b"Host: t\r\n: x\r\n"), 400),
    ("leading CRLF (ignored)", b"\r\n" + get(b"/health"), 200),
    ("Transfer-Encoding gzip, chunked", chunked(b"gzip, chunked"), 501),
    ("Transfer-Encoding gzip", chunked(b"gzip", b""), 400),
    ("chunked not last", chunked(b"chunked, gzip", b""), 400),
    ("chunked twice", chunked(b"chunked\r\nTransfer-Encoding: chunked"), 400),
    ("Transfer-Encoding and Content-Length", chunked(b"chunked\r\nContent-Length: 5"), 400),
    ("Transfer-Encoding in HTTP/1.0", chunked(b"chunked", version=b"HTTP/1.0"), 400),
    ("chunked alone (served)", chunked(b"chunked"), 200),
    ("Content-Length -1", post("/v1/embeddings", EMBED, length=-1), 400),
    ("Content-Length +15", post("/v1/embeddings", EMBED).replace(b"Length: 15", b"Length: +15"), 400),
    ("Content-Length 15, 15", post("/v1/embeddings", EMBED).replace(b"Length: 15", b"Length: 15, 15"), 400),
    ("Content-Length 1 5", post("/v1/embeddings", EMBED).replace(b"Length: 15", b"Length: 1 5"), 400),
    ("bad chunk size", chunked(b"chunked", b"zz\r\n" + EMBED + b"\r\n0\r\n\r\n"), 400),
]


@pytest.mark.parametrize("what,payload,status", SEMANTICS, ids=[c[0] for c in SEMANTICS])
def test_request_semantics(front, what, payload, status):
    with connect(front) as s:
        s.sendall(payload)
        got, headers, body = read_reply(s)
        assert got == status, (what, got, body[:300])
        if status >= 400:
            path = "/v1/embeddings" if b"/v1/embeddings" in payload else "/health"
            any_error_shape(path, orjson.loads(body))
            if status != 405:  # the app's 405 keeps the connection; the front's refusals close it
                assert headers["connection"] == "close" and closed_by_server(s, 5), (what, headers)
        elif what.startswith("asterisk"):
            assert headers["allow"] == "GET, HEAD, POST, OPTIONS" and headers["content-length"] == "0"
            assert re.fullmatch(r"[0-9a-f]{32}", headers.get("x-request-id", "")), headers  # every answer has one
    served(front)


def test_refusals_echo_the_request_id_once_the_head_is_parsed(front):
    """A refusal of a parsed head (two Host lines) carries the client's X-Request-Id; one whose
    head never completed (431) carries a generated id: nothing the client sent is trusted there."""
    with connect(front) as s:
        s.sendall(get(b"/health", headers=b"Host: a\r\nHost: a\r\nX-Request-Id: abc-123\r\n"))
        assert read_reply(s)[1]["x-request-id"] == "abc-123"
    with connect(front) as s:
        s.sendall(get(b"/health", headers=b"X-Request-Id: abc-123\r\nX-Big: " + b"a" * 70000 + b"\r\n"))
        status, headers, _ = read_reply(s)
        assert status == 431 and len(headers["x-request-id"]) == 32 and headers["x-request-id"] != "abc-123"


# ---- configuration ----------------------------------------------------------------------------
def test_a_low_open_file_limit_no_longer_drops_new_clients():
    """The issue's case: `ulimit -n 256` and a few hundred idle connections made new clients get
    closed unanswered (accept() failed with EMFILE). `serve` now raises the soft limit to fit
    --max-connections; with two gateway workers, which inherit it and the limits: 300 idle
    connections, and a new client is served at once; the idle ones are closed after 1 s."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2048 + 128:
        pytest.skip(f"the hard open-file limit {hard} is below the default cap's need")
    srv = BouquetProcess("--engine", "noop", "--gateway-workers", "2", "--timeout-connect-idle", "1",
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)))
    try:
        idle = [connect(srv) for _ in range(300)]
        served(srv)
        assert all(closed_by_server(c, 5) for c in idle)
        for c in idle:
            c.close()
        served(srv)
    finally:
        srv.stop()


def test_the_connection_cap_fits_the_open_file_limit():
    """A soft open-file limit below the cap is raised (children inherit it); a hard limit below
    it caps the connections instead, so that clients are answered 503 rather than dropped."""
    code = ("import resource, sys; from bouquet.gateway.limits import fit_connections\n"
            "soft, hard = map(int, sys.argv[1:]); resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))\n"
            "print(fit_connections(2048), resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    hard = 2048 + 128

    def run(soft: int, hard: int) -> list[int]:
        out = subprocess.run([sys.executable, "-c", code, str(soft), str(hard)], capture_output=True, text=True, check=True)
        return [int(x) for x in out.stdout.split()]

    assert run(256, hard) == [2048, hard]
    assert run(300, 300) == [300 - 128, 300]


def test_limits_are_validated():
    from bouquet.config import ConfigError, ServeConfig

    for field, bad in (("timeout_headers", 0), ("timeout_body", -1.0), ("timeout_connect_idle", 0.0),
                       ("timeout_read_gap", 0), ("max_header_bytes", 1023), ("max_header_count", 0),
                       ("max_connections", 0)):
        with pytest.raises(ConfigError, match="--" + field.replace("_", "-")):
            ServeConfig(**{field: bad}).validate()
