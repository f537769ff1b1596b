"""Load test on the CPU, loopback only: N concurrent clients send mixed-length requests for T seconds.

Usage:
  bouquet bench load --clients 512 --duration 60 [--max-queue-tokens 4000000] [--allow-429]
                           [--record bench/out/load-cpu.md]

Starts `bouquet serve` on 127.0.0.1 (or uses ``--url``). Each client loops: pick 1-8 texts of
3-200 words from a fixed pool, POST /v1/embeddings, check every returned vector against the
sentence-transformers reference of *its own* input (cosine ≥ 0.9999) and its index. Clients stop
sending at the deadline; requests still open are awaited (bounded by ``--timeout``), so the run
stops by itself. Fails (exit 1) on any lost request, 5xx, wrong vector, or, unless
``--allow-429``, any 429; with ``--allow-429`` every reply must be 200 or 429.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # the source checkout

from bouquet.bench.load import reference_vectors, run_load, summary, text_pool, verdict  # noqa: E402


def commit() -> str:
    from bouquet.bench.meta import source_commit

    return source_commit(REPO)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=512)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--max-queue-tokens", type=int, default=4_000_000)
    ap.add_argument("--allow-429", action="store_true", help="a low queue limit: 200 or 429, nothing else")
    ap.add_argument("--timeout", type=float, default=300.0, help="per-request timeout (s)")
    ap.add_argument("--url", default=None, help="use a running server on 127.0.0.1 instead of starting one")
    ap.add_argument("--record", default=None, help="append a result section to this markdown file")
    args = ap.parse_args(argv)

    from bouquet.bench.served import Served

    texts = text_pool()
    refs = reference_vectors(texts)
    srv = None if args.url else Served("--max-queue-tokens", str(args.max_queue_tokens))
    url = args.url or srv.url  # type: ignore[union-attr]
    assert url.startswith(("http://127.0.0.1", "http://localhost")), "load tests run on loopback only"
    try:
        tally, wall = asyncio.run(run_load(url, args.clients, args.duration, texts, refs, args.timeout))
    finally:
        if srv:
            srv.stop()
    res = summary(tally, wall)
    bad = verdict(tally, args.allow_429)
    print(json.dumps({**res, "failures": bad}, indent=1))
    if args.record:
        cmd = "bouquet bench load " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(args.record, "a", encoding="utf-8") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M')} — commit {commit()}\n\n`{cmd}`\n\n"
                    f"```json\n{json.dumps({**res, 'failures': bad}, indent=1)}\n```\n")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
