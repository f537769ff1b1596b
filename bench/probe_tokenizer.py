"""Tokenizer cost per text on this host: ``tokenizers`` encode paths for one text and for a batch.

    python bench/probe_tokenizer.py      # prints µs per text for each path
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.queries_sweep import read_sts  # noqa: E402
from bouquet.modelspec import load_spec  # noqa: E402
from bouquet.tokenization import TextTokenizer  # noqa: E402


def main() -> None:
    s1, _, _ = read_sts("test")
    tt = TextTokenizer(load_spec(None))
    t = tt._trunc["right"]
    long_text = "A man is playing a guitar on the stage while the crowd sings along."

    def bench(name: str, fn: object, n: int, per: int) -> None:
        fn()  # type: ignore[operator]
        t0 = time.perf_counter()
        for _ in range(n):
            fn()  # type: ignore[operator]
        print(f"{name}: {(time.perf_counter() - t0) / n / per * 1e6:.1f} µs/text", flush=True)

    bench("TextTokenizer.encode, 1 STSb text", lambda: tt.encode(s1[:1]), 20000, 1)
    bench("TextTokenizer.encode, 68-char text", lambda: tt.encode([long_text]), 20000, 1)
    for k in (1, 4, 16, 64):
        bench(f"encode_batch_fast x{k} STSb", lambda k=k: t.encode_batch_fast(s1[:k]), 2000, k)


if __name__ == "__main__":
    main()
