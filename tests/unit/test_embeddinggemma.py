"""EmbeddingGemma as sentence-transformers ships it: the bidirectional Gemma3 decoder, mean
pooling, two Dense layers (no bias, identity: 64 → 96 → 64 here, 768 → 3072 → 768 in the real
model), Normalize, and its task prompts — bouquet against sentence-transformers itself on a tiny
random directory (float32, cosine ≥ 0.9999). The bare decoder is compared with transformers in
test_model_families.py and served over HTTP in test_serve_families.py."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

from bouquet.engine.runtime.batch import Batch
from bouquet.engine.runtime.engine import Engine
from bouquet.engine.heads.pooling import finalize
from bouquet.modelspec import load_spec
from bouquet.tokenization import TextTokenizer
from helpers import cosine_rows
from tests.fixtures.tiny_decoders import GEMMA_PROMPTS
from tests.fixtures.tiny_models import make_tiny_model
from tests.fixtures.st_models import write_st_model

# one word up to well past the ±8-token window of the sliding layers (under the 64-token limit)
TEXTS = ["x", "hello world", "a somewhat longer sentence about search and ranking",
         " ".join(["river mountain city music paper"] * 3)]


def test_embeddinggemma_matches_sentence_transformers(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    base = make_tiny_model("gemma3", tmp_path / "base")
    dense = [dict(in_features=64, out_features=96, bias=False, activation_function=torch.nn.Identity()),
             dict(in_features=96, out_features=64, bias=False, activation_function=torch.nn.Identity())]
    out = write_st_model(base, tmp_path / "st", "mean", dense=dense)
    # the prompts EmbeddingGemma declares; the fixture's tokenizer.json as is (saving through
    # transformers' GemmaTokenizer rewrote it with Gemma's own space handling)
    shutil.copy(base / "tokenizer.json", out / "tokenizer.json")
    st_cfg = json.loads((out / "config_sentence_transformers.json").read_text())
    (out / "config_sentence_transformers.json").write_text(json.dumps(dict(st_cfg, prompts=GEMMA_PROMPTS)))
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps(dict(tok_cfg, tokenizer_class="PreTrainedTokenizerFast")))

    spec = load_spec(str(out))
    assert (spec.pooling, spec.causal, spec.dimension, spec.prompts) == ("mean", False, 64, GEMMA_PROMPTS)
    st = SentenceTransformer(str(out), device="cpu")
    tok = TextTokenizer(spec)
    engine = Engine(spec, "cpu", "float32")
    for name, prompt in GEMMA_PROMPTS.items():
        texts = [prompt + t for t in TEXTS]
        ids = tok.encode(texts).ids
        assert [list(x) for x in ids] == st.tokenizer(texts)["input_ids"]  # same tokens on both sides
        assert max(len(x) for x in ids) > 40  # far past the sliding layers' window
        with torch.inference_mode():
            got = finalize(engine.step(Batch.pack(ids)).wait(), spec.normalize, None)
        want = st.encode(TEXTS, prompt_name=name, convert_to_numpy=True, batch_size=len(TEXTS))
        assert got.shape == want.shape == (len(TEXTS), 64)
        assert cosine_rows(got, want).min() >= 0.9999, cosine_rows(got, want)
        assert cosine_rows(want[:-1], want[1:]).max() < 0.99  # different texts, clearly different vectors
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
