"""Tokenizer cost per text on this host: ``tokenizers`` encode paths for one text and for a batch,
wall and CPU time, with the library's own threads (TOKENIZERS_PARALLELISM unset) or without
(``=false``, as in multi-worker gateways).

    python bench/probes/probe_tokenizer.py; TOKENIZERS_PARALLELISM=false python bench/probes/probe_tokenizer.py
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

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
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            fn()  # type: ignore[operator]
        wall, cpu = (time.perf_counter() - t0) / n / per * 1e6, (time.process_time() - c0) / n / per * 1e6
        print(f"{name}: {wall:.1f} µs/text wall, {cpu:.1f} µs/text CPU", flush=True)

    bench("TextTokenizer.encode, 1 STSb text", lambda: tt.encode(s1[:1]), 20000, 1)
    bench("TextTokenizer.encode, 68-char text", lambda: tt.encode([long_text]), 20000, 1)
    for k in (1, 4, 16, 64):
        bench(f"encode_batch_fast x{k} STSb", lambda k=k: t.encode_batch_fast(s1[:k]), 2000, k)
    print("TOKENIZERS_PARALLELISM =", os.environ.get("TOKENIZERS_PARALLELISM"))


if __name__ == "__main__":
    main()
