"""The replica's public gRPC API refuses malformed requests with INVALID_ARGUMENT and a message
naming the field, before anything reaches the engine, and answers the next good request.
(Found by fresh-clone trials: a 3-byte ``input_ids`` was UNKNOWN, a token type id past the
model's types reached the engine as an IndexError, an unknown priority and ``dimensions`` with
``per_token`` were served without a word. A ``pool_skip`` covering a whole sequence is
not an error: mean pooling then gives the zero vector sentence-transformers gives, CLS and last-token
pooling ignore it. A call whose reply could not fit a gRPC message, 1.4 MB of ids asking for 540 MB of
per-token rows, ran to the end, held GBs, then failed RESOURCE_EXHAUSTED; it is refused up front.)"""
from __future__ import annotations

import re

import grpc
import numpy as np
import pytest

from bouquet.proto import bouquet_pb2 as pb
from bouquet.proto.rpc import SERVICE
from helpers import GrpcServer


@pytest.fixture(scope="module")
def server():
    """`bouquet server` on the embedded all-MiniLM-L6-v2 (BERT: 2 token types, vocabulary 30,522)."""
    srv = GrpcServer()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def replica(server):
    """Its Embed method, taking and answering messages."""
    with grpc.insecure_channel(server.address) as ch:
        yield ch.unary_unary(f"/{SERVICE}/Embed", request_serializer=pb.EmbedRequest.SerializeToString,
                             response_deserializer=pb.EmbedReply.FromString)


def _i32(*v: int) -> bytes:
    return np.asarray(v, dtype="<i4").tobytes()


GOOD = dict(input_ids=_i32(101, 7592, 2088, 102), lengths=_i32(4))
# 350,000 rows of 384 float32: 537.6 MB, just past the 512 MiB a gRPC message may carry
ROWS = 350_000
IDS = np.full(ROWS, 101, dtype="<i4").tobytes()


@pytest.mark.parametrize("fields,message", [
    (dict(input_ids=b"\x01\x02\x03", lengths=_i32(1)), "input_ids has 3 bytes, not a whole number of int32"),
    (dict(GOOD, lengths=b"\x04\x00"), "lengths has 2 bytes"),
    (dict(GOOD, token_type_ids=b"\x00" * 5), "token_type_ids has 5 bytes"),
    (dict(GOOD, token_type_ids=_i32(0, 0, 7, 0)), r"token type id 7 is outside the model's token types \[0, 2\)"),
    (dict(GOOD, token_type_ids=_i32(0, -1, 0, 0)), "token type id -1"),
    (dict(GOOD, pool_skip=-1), "pool_skip must be >= 0"),
    (dict(GOOD, priority=7), r"priority must be 0 \(auto\), 1 \(interactive\) or 2 \(batch\), got 7"),
    (dict(GOOD, per_token=True, dimensions=10), "dimensions .* applies to pooled rows, not to per_token outputs"),
    (dict(input_ids=_i32(101, 30522), lengths=_i32(2)), r"token id 30522 is outside the vocabulary \[0, 30522\)"),
    (dict(input_ids=IDS, lengths=np.full(ROWS // 250, 250, dtype="<i4").tobytes(), per_token=True),
     r"the reply would hold 350,000 token rows of 384 float32 values \(537,600,000 bytes\), more than the "
     r"536,866,816 bytes"),
    (dict(input_ids=IDS, lengths=np.ones(ROWS, dtype="<i4").tobytes()), "350,000 sequence rows of 384 float32"),
])
def test_malformed_request_is_invalid_argument_and_the_next_one_works(replica, fields, message):
    with pytest.raises(grpc.RpcError) as e:
        replica(pb.EmbedRequest(**fields), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
    assert re.search(message, e.value.details() or ""), e.value.details()
    reply = replica(pb.EmbedRequest(**GOOD, pool_skip=1), timeout=30)
    assert reply.num_tokens == 4 and len(reply.output.data) == 384 * 4  # one float32 vector of 384


@pytest.mark.parametrize("raw", [b"\xff\xff\xff\xff\x0f garbage", b"\x0a\x10short"])
def test_corrupt_message_is_invalid_argument_and_the_next_one_works(server, replica, raw):
    # bytes that are no EmbedRequest (a bad tag; a length past the end): grpcio answered UNKNOWN
    # ("Unexpected DecodeError") and logged a traceback
    with grpc.insecure_channel(server.address) as ch:
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary(f"/{SERVICE}/Embed")(raw, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
    assert "not a valid bouquet.v1.EmbedRequest message" in (e.value.details() or ""), e.value.details()
    assert replica(pb.EmbedRequest(**GOOD), timeout=30).num_tokens == 4


def test_pool_skip_refused_by_a_scoring_replica(tmp_path):
    # A cross-encoder's head reads its [CLS] row: pool_skip moved it and changed the score, unasked
    from tests.fixtures.tiny_models import make_tiny_model

    srv = GrpcServer("--model", str(make_tiny_model("bert-cross", tmp_path / "bert-cross")))
    try:
        with grpc.insecure_channel(srv.address) as ch:
            embed = ch.unary_unary(f"/{SERVICE}/Embed", request_serializer=pb.EmbedRequest.SerializeToString,
                                   response_deserializer=pb.EmbedReply.FromString)
            pair = dict(input_ids=_i32(2, 8, 3, 9, 3), lengths=_i32(5), token_type_ids=_i32(0, 0, 0, 1, 1))
            with pytest.raises(grpc.RpcError) as e:
                embed(pb.EmbedRequest(**pair, pool_skip=2), timeout=30)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
            assert "pool_skip applies to embedding models" in (e.value.details() or ""), e.value.details()
            assert embed(pb.EmbedRequest(**pair), timeout=30).output.shape == [1, 1]
    finally:
        srv.stop()
