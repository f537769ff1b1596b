"""gRPC bindings for ``bouquet.proto``, built with grpcio's public generic-handler API.

We do not commit ``*_pb2_grpc.py``: grpcio-tools stamps it with its own version and it refuses
to import under an older grpcio runtime (the H200 image has 1.84). The message classes in
``bouquet_pb2.py`` only need protobuf >= 7.35. Regenerate them with
``python -m grpc_tools.protoc -I bouquet/proto --python_out=bouquet/proto --pyi_out=bouquet/proto bouquet.proto``.
"""
from __future__ import annotations

import hmac
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc
from google.protobuf.message import DecodeError

from bouquet.proto import bouquet_pb2 as pb

SERVICE = "bouquet.v1.Inference"
# Large batches of vectors exceed gRPC's 4 MB default.
MAX_MESSAGE_BYTES = 512 * 1024 * 1024
# The largest reply a call may ask for: the float32 rows, with room left for the rest of the message
# under MAX_MESSAGE_BYTES, which no larger reply could be sent through. Replicas refuse a call past it
# (server/service.py); the gateway cuts its calls to stay within it (gateway/replicas.py).
MAX_REPLY_BYTES = MAX_MESSAGE_BYTES - 4096
_MESSAGE_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# Gateway side. Keepalive pings notice a replica whose machine vanished without closing the
# connection (no RST), so its calls fail within ~30 s instead of waiting for the deadline; a short
# reconnect backoff lets a restarted replica (same address) be used again within seconds.
CHANNEL_OPTIONS = [
    *_MESSAGE_OPTIONS,
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]
# Server side: accept the gateway's pings during long calls (the default policy answers pings
# more often than every 5 minutes with GOAWAY). SO_REUSEPORT off: gRPC sets it by default on Linux,
# so a second replica started on a port another one holds bound it too and the kernel split the
# gateways' connections between the two; off, that start fails with the address named.
SERVER_OPTIONS = [
    *_MESSAGE_OPTIONS,
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.so_reuseport", 0),
]
_METHODS: dict[str, tuple[Any, Any]] = {
    "Embed": (pb.EmbedRequest, pb.EmbedReply),
    "Info": (pb.InfoRequest, pb.InfoReply),
}


def add_servicer(server: grpc.aio.Server, impl: Any) -> None:
    """Register ``impl.Embed`` and ``impl.Info`` (async methods taking (request, context)). A request
    that is not a valid message of its type gets INVALID_ARGUMENT (grpcio would answer UNKNOWN and
    log a traceback)."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(_parsed(getattr(impl, name), req),
                                                  response_serializer=rep.SerializeToString)
        for name, (req, rep) in _METHODS.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


def _parsed(method: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]], message: Any) -> Any:
    """``method`` taking the raw request bytes: parsed into ``message`` here, INVALID_ARGUMENT when
    they are not one."""

    async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            request = message.FromString(raw)
        except DecodeError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"the request is not a valid {message.DESCRIPTOR.full_name} message: {e}")
            raise AssertionError("unreachable: abort raises") from None
        return await method(request, context)

    return handler


def bearer_metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries ``api_key`` (``authorization: Bearer KEY``, as the HTTP API
    takes it; gRPC metadata keys are lower case); empty without a key."""
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call but the health service's with UNAUTHENTICATED unless its metadata holds
    ``authorization: Bearer KEY`` (the scheme in any case; the key compared in constant time).
    Health stays open: Kubernetes' ``grpc:`` probe sends no metadata, and SERVING / NOT_SERVING is
    all it learns."""

    def __init__(self, api_key: str) -> None:
        self._expected = api_key.encode()

        async def refuse(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "missing or invalid 'authorization: Bearer' metadata; this replica requires the API key")
            raise AssertionError("unreachable: abort raises")

        # A refused call's request is never read (_UNREAD): a client without the key made the
        # replica take in up to MAX_MESSAGE_BYTES per call before its refusal.
        self._refuse = grpc.stream_unary_rpc_method_handler(refuse)

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        if details.method.startswith(f"/{HEALTH_SERVICE}/"):
            return await continuation(details)
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                # the scheme in any case, as the gateway's HTTP port takes it (RFC 9110 §11.1)
                parts = (value.encode() if isinstance(value, str) else value).split(None, 1)
                if (len(parts) == 2 and parts[0].lower() == b"bearer"
                        and hmac.compare_digest(parts[1].strip(), self._expected)):
                    return await continuation(details)
                break
        return self._refuse


class InferenceStub:
    """Client side: ``await stub.Embed(req, timeout=...)``; every call carries ``api_key``
    (bearer_metadata) when one is given."""

    Embed: Callable[..., Awaitable[pb.EmbedReply]]
    Info: Callable[..., Awaitable[pb.InfoReply]]

    def __init__(self, channel: grpc.aio.Channel, api_key: str | None = None) -> None:
        self.metadata = bearer_metadata(api_key)
        for name, (req, rep) in _METHODS.items():
            call = channel.unary_unary(
                f"/{SERVICE}/{name}", request_serializer=req.SerializeToString, response_deserializer=rep.FromString
            )
            setattr(self, name, self._with_key(call) if self.metadata else call)

    def _with_key(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def keyed(request: Any, *, metadata: tuple[tuple[str, str], ...] = (), **kw: Any) -> Any:
            return call(request, metadata=self.metadata + tuple(metadata), **kw)

        return keyed


# _UNREAD: the handlers that answer without the request (health, and every refusal for a missing
# API key, both open to any client) take it as a stream they never read: grpc reads a unary request
# whole, up to MAX_MESSAGE_BYTES, before its handler runs, while an unread stream stays behind HTTP/2
# flow control. A unary client calls them as it calls any method (one message each way on the wire).

# The standard gRPC health service (grpc.health.v1.Health/Check), so that Kubernetes' native
# `grpc:` readiness probe works without extra packages. Its two messages are tiny and fixed:
# HealthCheckResponse{status = SERVING (1) | NOT_SERVING (2)} is field 1, varint.
HEALTH_SERVICE = "grpc.health.v1.Health"
HEALTH_SERVING, HEALTH_NOT_SERVING = b"\x08\x01", b"\x08\x02"


def add_health(server: grpc.aio.Server, is_ready: Callable[[], bool]) -> None:
    """Answer ``Check`` with SERVING while ``is_ready()`` (raw bytes out; the request is not read
    (_UNREAD), its ``service`` name ignored: a replica serves one model)."""

    async def check(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        return HEALTH_SERVING if is_ready() else HEALTH_NOT_SERVING

    handler = grpc.stream_unary_rpc_method_handler(check)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(HEALTH_SERVICE, {"Check": handler}),))
