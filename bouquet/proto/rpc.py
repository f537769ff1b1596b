"""gRPC bindings for ``bouquet.proto``, built with grpcio's public generic-handler API.

We do not commit ``*_pb2_grpc.py``: grpcio-tools stamps it with its own version and it refuses
to import under an older grpcio runtime (the H200 image has 1.84). The message classes in
``bouquet_pb2.py`` only need protobuf >= 7.35. Regenerate them with
``python -m grpc_tools.protoc -I bouquet/proto --python_out=bouquet/proto --pyi_out=bouquet/proto bouquet.proto``.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

import grpc

from bouquet.proto import bouquet_pb2 as pb

SERVICE = "bouquet.v1.Inference"
# Large batches of vectors exceed gRPC's 4 MB default.
MAX_MESSAGE_BYTES = 512 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
_METHODS: dict[str, tuple[Any, Any]] = {
    "Embed": (pb.EmbedRequest, pb.EmbedReply),
    "Info": (pb.InfoRequest, pb.InfoReply),
}


def add_servicer(server: grpc.aio.Server, impl: Any) -> None:
    """Register ``impl.Embed`` and ``impl.Info`` (async methods taking (request, context))."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(impl, name), request_deserializer=req.FromString, response_serializer=rep.SerializeToString
        )
        for name, (req, rep) in _METHODS.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


class InferenceStub:
    """Client side: ``await stub.Embed(req, timeout=...)``."""

    Embed: Callable[..., Awaitable[pb.EmbedReply]]
    Info: Callable[..., Awaitable[pb.InfoReply]]

    def __init__(self, channel: grpc.aio.Channel) -> None:
        for name, (req, rep) in _METHODS.items():
            setattr(self, name, channel.unary_unary(
                f"/{SERVICE}/{name}", request_serializer=req.SerializeToString, response_deserializer=rep.FromString
            ))
