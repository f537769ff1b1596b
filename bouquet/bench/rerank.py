"""The ``rerank`` benchmark: one query against N documents per request, Cohere-shaped ``POST /v1/rerank``.

The query and each document are random vocabulary words cut at ``query_tokens`` / ``doc_tokens``
tokens of the model's tokenizer (special tokens and the pair template come on top).

Per (N, clients) case: ``clients`` threads, one keep-alive connection each, send requests back to
back for ``Settings.seconds`` (after ``Settings.warmup_s`` of the same load, untimed); every
request has its own query and documents (none repeats, so no cache on either side helps). Rows:
p50 / p99 latency (ms) and pairs/s (documents scored per second, all clients together).

Targets: bouquet (``http``, ``http-noop``: a server started here on a random-weight cross-encoder
of the model's shape, ``cross_model_dir``) and any server with a Cohere-shaped ``/v1/rerank``
(``rerank-url``: TEI, Infinity, vLLM's ``/v1/rerank``, Jina's API...).
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from bouquet.bench.models import ModelShape, build_once, save_random_model


@dataclass(frozen=True)
class RerankSettings:
    docs: tuple[int, ...] = (20, 100)  # documents per request (N)
    doc_tokens: int = 250  # tokens per document (about: whole vocabulary words)
    query_tokens: int = 16
    clients: tuple[int, ...] = (1, 4)


def cross_model_dir(shape: ModelShape, root: Path, tokenizer: Path, seed: int = 0) -> Path:
    """``root/<name>-cross``: the shape as a reranker with random weights (what ``/v1/rerank``
    scores pairs with), unless it exists. A BERT-family shape becomes a one-label
    ``*ForSequenceClassification`` cross-encoder; a decoder shape (Qwen3) a ``*ForCausalLM`` marked
    ``"is_reranker": true``, scored as Qwen3-Reranker is: P("yes") over the yes/no logits at the
    last position of its prompt template (the tokenizer must hold "yes" and "no": the real Qwen3
    one does)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    out = root / f"{shape.name}-cross"
    if (out / "model.safetensors").exists():
        return out
    decoder = shape.gated
    fields = {k: v for k, v in shape.config.items() if k != "architectures"}
    cfg = AutoConfig.for_model(**fields) if decoder else AutoConfig.for_model(**fields, num_labels=1)
    auto = AutoModelForCausalLM if decoder else AutoModelForSequenceClassification
    dev = "cuda" if torch.cuda.is_available() else "cpu"

    def build() -> Any:
        with torch.device(dev):
            return auto.from_config(cfg, dtype=torch.bfloat16 if dev == "cuda" else torch.float32)

    extra: dict[str, Any] = {"bouquet": {"max_seq_length": shape.max_len}}
    if decoder:
        extra["is_reranker"] = True
    return build_once(out, lambda folder: save_random_model(folder, build, tokenizer, seed=seed, config_extra=extra))


def _bodies(tok: Any, words: list[str], n_docs: int, rs: RerankSettings, count: int, seed: int,
            model: str | None) -> list[bytes]:
    rng = np.random.default_rng(seed)

    def text(tokens: int) -> str:
        """Random vocabulary words cut where the text reaches ``tokens`` tokens (without special
        tokens): a word of the vocabulary can take several tokens after a space (byte-level BPE)."""
        t = " ".join(rng.choice(words, size=tokens))
        offsets = tok.encode(t, add_special_tokens=False).offsets
        return t[: offsets[tokens - 1][1]] if len(offsets) > tokens else t

    out = []
    for _ in range(count):
        body: dict[str, Any] = {"query": text(rs.query_tokens), "documents": [text(rs.doc_tokens) for _ in range(n_docs)]}
        if model:
            body["model"] = model
        out.append(json.dumps(body).encode())
    return out


def _client_loop(url: str, bodies: list[bytes], start: int, step: int, end: float, lat: list[float], errors: list[str]) -> None:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=600)
    path = (u.path.rstrip("/") or "") + "/v1/rerank"
    k = start
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        conn.request("POST", path, bodies[k % len(bodies)], {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            errors.append(f"HTTP {resp.status}: {data[:300]!r}")
            return
        lat.append(time.perf_counter() - t0)
        k += step
    conn.close()


def _window(url: str, bodies: list[bytes], clients: int, seconds: float) -> tuple[list[float], float]:
    lats: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    t0 = time.perf_counter()
    threads = [threading.Thread(target=_client_loop, args=(url, bodies, c, clients, t0 + seconds, lats[c], errors))
               for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"rerank requests failed: {errors[0]}")
    return [x for xs in lats for x in xs], time.perf_counter() - t0


def bench_rerank(url: str, system: str, tokenizer: Path, rs: RerankSettings, seconds: float, warmup_s: float,
                 model: str | None = None) -> list[dict[str, Any]]:
    """Rows ``{"bench": "rerank", "case", "system", "docs", "doc_tokens", "clients", "requests",
    "p50", "p99" (ms), "pairs_s"}``, one per (N, clients). Raises RuntimeError when a request
    gets a non-200 answer."""
    from tokenizers import Tokenizer

    from bouquet.bench.run import vocab_words

    tok = Tokenizer.from_file(str(tokenizer))
    tok.no_padding()  # some tokenizer.json files pad or truncate (all-MiniLM-L6-v2's: to 128)
    tok.no_truncation()
    words = vocab_words(tok)
    rows = []
    for n in rs.docs:
        bodies = _bodies(tok, words, n, rs, 64, seed=n, model=model)
        for c in rs.clients:
            if warmup_s > 0:
                _window(url, bodies[::-1], c, warmup_s)
            lat, elapsed = _window(url, bodies, c, seconds)
            ms = np.sort(np.asarray(lat)) * 1e3
            rows.append({"bench": "rerank", "case": f"N={n} x {rs.doc_tokens} tokens, {c} client(s)", "system": system,
                         "docs": n, "doc_tokens": rs.doc_tokens, "clients": c, "requests": len(lat),
                         "p50": round(float(np.percentile(ms, 50)), 2), "p99": round(float(np.percentile(ms, 99)), 2),
                         "pairs_s": round(len(lat) * n / elapsed, 1)})
    return rows
