"""The named suites of `bouquet bench` (bench/README.md).

Two kinds: *load suites* pick the benchmarks and systems of the side-by-side driver (``bouquet
bench --suite NAME``; ``--benchmarks`` / ``--system`` given explicitly win), and *tool suites* are
programs of their own with their own arguments (``bouquet bench NAME ARGS``; ``bouquet bench NAME
--help`` lists them), each a module of bouquet/bench/tools/ with ``main(argv)``.
"""
from __future__ import annotations

from dataclasses import dataclass

from bouquet.bench.cpu import CPU_SYSTEMS


@dataclass(frozen=True)
class LoadSuite:
    benchmarks: tuple[str, ...]
    systems: tuple[str, ...]
    what: str


LOAD_SUITES: dict[str, LoadSuite] = {
    "writeup": LoadSuite(("1", "2", "3", "mixed", "4"), ("engine", "grpc", "http", "transformers"),
                         "the write-up's four benchmarks (and mixed lengths) beside transformers"),
    "queries": LoadSuite(("5",), ("http", "http-noop"),
                         "online queries: one short text per request from 64 / 256 client processes"),
    "rerank": LoadSuite(("rerank",), ("http", "http-noop"), "one query against N documents, /v1/rerank"),
    "engine-ab": LoadSuite(("1", "2", "3", "mixed", "4"), ("engine", "engine-fp8", "http", "http-fp8"),
                           "engine and HTTP rows in bf16 and fp8: run it from two checkouts, then --baseline"),
    "cpu": LoadSuite(("cpu",), CPU_SYSTEMS,
                     "all-MiniLM-L6-v2 on the CPU: bouquet fp32 / bf16 / int8 / HTTP beside sentence-transformers and "
                     "ONNX Runtime fp32 / int8 (make bench-cpu)"),
}

# name: (module under bouquet.bench.tools, device, what it measures)
TOOL_SUITES: dict[str, tuple[str, str, str]] = {
    "fp8-accuracy": ("fp8_accuracy", "GPU", "fp8 vs bf16 vs sentence-transformers: real MiniLM on STSb, random full-size models"),
    "models-check": ("models_check", "GPU / CPU --tiny", "every model family at full size against transformers, same weights"),
    "cpu-sts": ("cpu_sts", "CPU", "STSb sentences/s: bouquet in process and over HTTP vs sentence-transformers"),
    "layouts": ("layouts", "any", "online queries over server layouts (gateway workers x replicas x transport)"),
    "wrk": ("wrk", "any (needs wrk)", "online queries against a running server, driven by wrk"),
    "gateway-tokens": ("gateway_tokens", "GPU / CPU --tiny", "tokens/s of text through the gateway vs the bare engine"),
    "gateway-overhead": ("gateway_overhead", "CPU", "the gateway's CPU per request on the no-op engine"),
    "serving-profile": ("serving_profile", "any (needs py-spy)", "where one request's CPU goes, per category"),
    "priority": ("priority", "CPU", "interactive latency under a saturating bulk load, with and without priority classes"),
    "load": ("load", "CPU", "the long load run (tests/integration/test_load.py runs it reduced)"),
    "soak": ("soak", "CPU", "the soak run: memory and errors over many requests"),
    "embed": ("embed", "GPU / CPU", "`bouquet embed` against the bare engine on the same rows; --host-only: the host ceiling"),
    "embed-stream": ("embed_stream", "CPU", "`bouquet embed` on 1,000,000 rows: rows/s and resident memory"),
    "replicas": ("replicas", "2 GPUs", "benchmark 3 on one replica vs two"),
}


def suites_table() -> str:
    """Every suite with the command that runs it, as a Markdown table (``bouquet bench suites``)."""
    lines = ["| suite | command | what |", "|---|---|---|"]
    for name, s in LOAD_SUITES.items():
        lines.append(f"| {name} | `bouquet bench --suite {name}` (benchmarks {','.join(s.benchmarks)}; systems "
                     f"{', '.join(s.systems)}) | {s.what} |")
    for name, (_, device, what) in TOOL_SUITES.items():
        lines.append(f"| {name} | `bouquet bench {name} --help` ({device}) | {what} |")
    return "\n".join(lines)
