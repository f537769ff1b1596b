"""`bouquet bench`: build random-weight models, start the systems, check, time, report.

Per model shape: the transformers reference is loaded first; each system is checked against it
(cosine within 0.1%) before it is timed; the in-process engine also runs the graph == eager check
for every bucket it captures. Systems: ``engine`` (in process, a request = one step), ``replica``
(in process, as a served replica steps it: replica_target.py), ``grpc`` and ``http`` (a bouquet
server started here, or the one at ``grpc_address``/``http_url``), ``openai`` (any
OpenAI-compatible URL), ``transformers``.
"""
from __future__ import annotations

import datetime as _dt
import gc
import logging
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bouquet.bench import run as R
from bouquet.bench.meta import source_commit
from bouquet.bench.models import SHAPES, ModelShape, default_tokenizer, make_model_dir, tiny
from bouquet.bench.rerank import RerankSettings, bench_rerank, cross_model_dir
from bouquet.bench.targets import EngineTarget, GrpcTarget, HttpTarget, ServerProcess, Target, TransformersTarget
from bouquet.modelspec import load_spec
from bouquet.tokenization import TextTokenizer
from bouquet.tokenized import appended_tokens, read_tokenizer

log = logging.getLogger("bouquet.bench")
BENCHMARKS = ("1", "2", "3", "mixed", "4", "5", "rerank")  # bench/README.md
SYSTEMS = ("engine", "engine-fp8", "engine-cublas", "engine-fp8-cublas", "replica", "replica-fp8", "grpc", "http", "http-fp8",
           "http-cublas", "http-noop", "openai", "rerank-url", "transformers")
RERANK_SYSTEMS = ("http", "http-noop", "rerank-url")  # the systems the rerank benchmark runs on


@dataclass(frozen=True)
class BenchOptions:
    models: tuple[str, ...] = ("bge-base",)
    systems: tuple[str, ...] = ("engine", "grpc", "http", "transformers")
    benchmarks: tuple[str, ...] = ("1", "2", "3", "mixed", "4")
    device: str = "cuda"
    out: Path = Path("bench/out")
    models_root: Path = Path("bench/out/models")
    tokenizer: Path | None = None
    tiny: bool = False  # small model copies (CPU smoke runs)
    settings: R.Settings = field(default_factory=R.Settings)
    grpc_address: str | None = None
    http_url: str | None = None
    openai_url: str | None = None
    openai_model: str | None = None
    graph_check: bool = True
    commit: str | None = None
    gateway_workers: int = 0  # gateway processes of the HTTP server the bench starts (0: as `serve` chooses)
    replicas_per_gpu: int = 0  # replica processes per GPU of that server (0: as `serve` chooses)
    query_texts: Path | None = None  # benchmark 5: one text per line (default: generated, 16-64 tokens)
    rerank: RerankSettings = field(default_factory=RerankSettings)
    rerank_url: str | None = None  # system 'rerank-url': any server with a Cohere-shaped /v1/rerank
    rerank_model: str | None = None  # the 'model' field sent to --rerank-url


def _meta(opts: BenchOptions, rate: float) -> dict[str, Any]:
    import torch
    import transformers

    commit = opts.commit
    if commit is None:
        commit = source_commit(Path.cwd())
    gpu = torch.cuda.get_device_name() if opts.device.startswith("cuda") else None
    return {"commit": commit, "date": _dt.datetime.now().isoformat(timespec="seconds"), "gpu": gpu,
            "cpu": f"{platform.processor() or platform.machine()} x{__import__('os').cpu_count()}",
            "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "matmul_tflops": rate / 1e12,
            "settings": opts.settings.__dict__, "device": opts.device, "gateway_workers": opts.gateway_workers,
            "replicas_per_gpu": opts.replicas_per_gpu}


def graph_check(engine_target: EngineTarget, shape: ModelShape, rng: np.random.Generator) -> dict[str, Any]:
    """Replay == eager for a spread of buckets: each batch runs three times (eager warm-up,
    capture, replay) and the replay is compared with an exact-shape eager forward."""
    import torch

    from bouquet.engine.runtime.batch import Batch

    eng = engine_target.engine
    vocab = shape.config["vocab_size"]
    cases = [[1], [7], [128], [512], [5] * 3, [512] * 5, [300, 17, 64, 1]]
    cases += [list(rng.integers(16, 513, size=n)) for n in (8, 25, 50)]
    if shape.max_len >= 4096:
        cases += [[4096], [2000, 1000]]
    worst, max_diff = 1.0, 0.0
    for lengths in cases:
        batch = Batch.pack(R.random_seqs(rng, [int(n) for n in lengths], vocab))
        for _ in range(3):
            got = eng.step(batch).wait()
        want = eng.forward(batch).cpu().numpy()
        cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1) + 1e-12)
        worst = min(worst, float(cos.min()))
        max_diff = max(max_diff, float(np.abs(got - want).max()))
    stats: dict[str, Any] = eng.graphs.stats() if eng.graphs is not None else {"captured": 0, "capture_s": 0.0}
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    return {"buckets_checked": len(cases), "worst_cosine": worst, "max_abs_diff": max_diff,
            "captured": stats["captured"], "capture_s": stats["capture_s"], "peak_mem_gib": peak}


# systems that are `bouquet serve` with one option changed: the baselines of those changes
_SERVE_ARGS = {"http-cublas": ("--no-triton-gemms",)}  # cuBLAS for every GEMM (no split-K, no small qkv / MLP-in, no gate/up + activation)


def _open(system: str, model_dir: Path, opts: BenchOptions, servers: list[ServerProcess]) -> Target:
    if system.startswith("engine") and system in SYSTEMS:
        return EngineTarget(model_dir, opts.device, quantization="fp8" if system.startswith("engine-fp8") else "none",
                            cublas=system.endswith("-cublas"))
    if system in ("replica", "replica-fp8"):
        from bouquet.bench.replica_target import ReplicaTarget

        return ReplicaTarget(model_dir, opts.device, quantization="fp8" if system == "replica-fp8" else "none")
    if system == "transformers":
        return TransformersTarget(model_dir, opts.device)
    if system in ("grpc", "http", "http-noop", "http-fp8", *_SERVE_ARGS):
        given = opts.grpc_address if system == "grpc" else opts.http_url if system == "http" else None
        if given is None:  # start our own and watch it while it loads
            servers.append(ServerProcess("grpc" if system == "grpc" else "http", model_dir, opts.device,
                                         gateway_workers=opts.gateway_workers, replicas_per_gpu=opts.replicas_per_gpu,
                                         engine="noop" if system == "http-noop" else "torch",
                                         quantization="fp8" if system == "http-fp8" else "none",
                                         serve_args=_SERVE_ARGS.get(system, ())))
        address = given or servers[-1].address
        remote: GrpcTarget | HttpTarget = (GrpcTarget(address) if system == "grpc" else
                                           HttpTarget(address, name="bouquet-" + system))
        if system == "http-fp8":
            remote.tolerance = 0.01  # the fp8 bar for random weights, as engine-fp8's
        remote.wait_ready(300, servers[-1].check if servers else lambda: None)
        return remote
    if system == "openai":
        if not opts.openai_url:
            raise ValueError("system 'openai' needs --openai-url")
        return HttpTarget(opts.openai_url, opts.openai_model, name="openai-url")
    raise ValueError(f"unknown system {system!r}; choose from {SYSTEMS}")


def bench_model(shape: ModelShape, opts: BenchOptions, rate: float) -> dict[str, Any]:
    tok = shape.path / "tokenizer.json" if shape.path is not None else opts.tokenizer or default_tokenizer()
    res: dict[str, Any] = {"rows": [], "checks": {}, "errors": {}}
    if any(b != "rerank" for b in opts.benchmarks):
        _embedding_suite(shape, opts, rate, tok, res)
    if "rerank" in opts.benchmarks:
        _rerank_suite(shape, opts, tok, res)
    return res


def _embedding_suite(shape: ModelShape, opts: BenchOptions, rate: float, tok: Path, res: dict[str, Any]) -> None:
    """Benchmarks 1-5 on each system, after its check against transformers."""
    # a real model directory: its own weights and tokenizer
    model_dir = shape.path if shape.path is not None else make_model_dir(shape, opts.models_root, tok)
    s = opts.settings
    rng = np.random.default_rng(0)
    check_seqs = R.random_seqs(rng, [7, 128, 512, 33], shape.config["vocab_size"])
    ref = TransformersTarget(model_dir, opts.device)
    texts = R.make_texts(str(tok), 64, s.conc_len, appended=served_appended(model_dir))
    res["model_dir"] = str(model_dir)
    for system in opts.systems:
        if system == "rerank-url":
            continue
        servers: list[ServerProcess] = []
        target: Target | None = None
        try:
            target = ref if system == "transformers" else _open(system, model_dir, opts, servers)
            log.info("%s / %s: checking against transformers", shape.name, target.name)
            if target.name != "bouquet-http-noop":  # zero vectors by design: benchmark 5 checks their shape
                # the row-wise fp8 baseline runs fp8 from 1,024 tokens only: the fp8 check sends enough
                seqs = check_seqs * 2 if target.tolerance > 1e-3 else check_seqs
                res["checks"][target.name] = R.cosine_check(target, ref, seqs, target.tolerance)
                if getattr(target, "fp8_cosine", None) is not None:  # (min, mean) of the load-time probe
                    res["fp8_probe_cosine_vs_bf16"] = target.fp8_cosine
            for phase in ("graphs", "latency", "throughput", "concurrency", "queries"):
                try:  # a failing phase (say, a request size a server refuses) keeps the others
                    _phase(phase, target, ref, shape, opts, rate, rng, texts, model_dir, res)
                except Exception as e:  # noqa: BLE001
                    log.exception("%s / %s / %s failed", shape.name, system, phase)
                    res["errors"][f"{system}/{phase}"] = f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - one failing system must not lose the others' rows
            log.exception("%s / %s failed", shape.name, system)
            res["errors"][system] = f"{type(e).__name__}: {e}"
        finally:
            if target is not None and target is not ref:
                target.close()
            for sp in servers:
                sp.stop()
            del target
            gc.collect()
            _free_cuda()


def _rerank_suite(shape: ModelShape, opts: BenchOptions, tok: Path, res: dict[str, Any]) -> None:
    """The rerank benchmark on each of RERANK_SYSTEMS in ``opts.systems``: bouquet on a cross-encoder
    of ``shape`` (``cross_model_dir``; a real model directory is served as it is), or ``--rerank-url``."""
    s = opts.settings
    for system in [x for x in opts.systems if x in RERANK_SYSTEMS]:
        servers: list[ServerProcess] = []
        try:
            if system == "rerank-url":
                if not opts.rerank_url:
                    raise ValueError("system 'rerank-url' needs --rerank-url")
                url, model = opts.rerank_url, opts.rerank_model
            else:
                model_dir = shape.path or cross_model_dir(shape, opts.models_root, tok)
                if opts.http_url and system == "http":
                    url = opts.http_url
                else:
                    servers.append(ServerProcess("http", model_dir, opts.device, gateway_workers=opts.gateway_workers,
                                                 replicas_per_gpu=opts.replicas_per_gpu,
                                                 engine="noop" if system == "http-noop" else "torch"))
                    url = servers[-1].address
                    HttpTarget(url).wait_ready(300, servers[-1].check)
                model = None
            rows = bench_rerank(url, system if system == "rerank-url" else "bouquet-" + system, tok, opts.rerank,
                                s.seconds, s.warmup_s, model)
            res["rows"] += rows
            for r in rows:
                log.info("%s", r)
        except Exception as e:  # noqa: BLE001 - one failing system must not lose the others' rows
            log.exception("%s / %s / rerank failed", shape.name, system)
            res["errors"][f"{system}/rerank"] = f"{type(e).__name__}: {e}"
        finally:
            for sp in servers:
                sp.stop()


def _phase(phase: str, target: Target, ref: Target, shape: ModelShape, opts: BenchOptions, rate: float,
           rng: np.random.Generator, texts: list[str], model_dir: Path, res: dict[str, Any]) -> None:
    s, want = opts.settings, opts.benchmarks
    n_rows = len(res["rows"])
    if phase == "graphs" and isinstance(target, EngineTarget) and opts.graph_check and opts.device.startswith("cuda"):
        res["graphs"] = graph_check(target, shape, rng)
        log.info("graph check: %s", res["graphs"])
    elif phase == "latency" and ("1" in want or "2" in want):
        res["rows"] += R.bench_latency(target, shape, s, rate, rng, tuple(b for b in ("1", "2") if b in want))
    elif phase == "throughput" and ("3" in want or "mixed" in want):
        res["rows"] += R.bench_throughput(target, shape, s, rate, "mixed" in want, "3" in want)
    elif phase == "concurrency" and "4" in want and target.tokenizes and target.name != "bouquet-http-noop":
        if isinstance(target, HttpTarget) and target.name == "bouquet-http":
            res["checks"][target.name + "-text"] = _text_check(target, ref, model_dir, texts[0])
        res["rows"] += R.bench_concurrency(target, shape, s, rate, texts)
    elif phase == "queries" and "5" in want and isinstance(target, HttpTarget):
        queries = query_texts(opts, model_dir)
        check = _zero_check(shape) if target.name == "bouquet-http-noop" else _query_check(ref, model_dir, queries)
        res["rows"] += R.bench_queries(target.url, queries, s, target.name, target.model, check)
    for r in res["rows"][n_rows:]:
        log.info("%s", r)


def _text_check(target: HttpTarget, ref: Target, model_dir: Path, text: str) -> float:
    """The gateway's text path against the reference on the same ids, tokenized here as the
    gateway does (no padding, truncation to the model's limit, EOS appended where declared)."""
    from tokenizers import Tokenizer

    from bouquet.modelspec import load_spec

    spec = load_spec(str(model_dir))
    eos = spec.append_eos_id
    tk = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tk.no_padding()  # the MiniLM file pads to 128 by default
    tk.enable_truncation(spec.max_seq_length - (1 if eos is not None else 0))
    ids = tk.encode(text).ids + ([eos] if eos is not None else [])
    return R.cosine_check(_Fixed(target.embed_texts([text])), ref, [np.array(ids, np.int32)])


def query_texts(opts: BenchOptions, model_dir: Path) -> list[str]:
    """Benchmark 5's texts: ``opts.query_texts`` (one per line), else 2,000 generated ones of
    ``settings.query_tokens`` tokens (uniform), whole vocabulary words."""
    if opts.query_texts is not None:
        return [t for t in opts.query_texts.read_text(encoding="utf-8").splitlines() if t.strip()]
    lo, hi = opts.settings.query_tokens
    return R.make_texts(str(model_dir / "tokenizer.json"), 2000, (lo, hi), seed=5, appended=served_appended(model_dir))


def served_appended(model_dir: Path) -> int:
    """Tokens a server of ``model_dir`` adds to each text after its tokenizer.json's special tokens
    (``TextTokenizer.appended``): the texts of benchmarks 4 and 5 leave room for them, so that a
    "512-token" text is 512 tokens in the engine, as the token-id rows beside it are."""
    spec = load_spec(str(model_dir))
    base = read_tokenizer(spec)  # not a whole TextTokenizer: its fast paths cost ~1 s to build
    base.no_padding()  # as TextTokenizer: a padded "a" ends in the pad id (Qwen's is its EOS), not the EOS
    base.no_truncation()
    return appended_tokens(spec, base)


def _tokenize_like_gateway(model_dir: Path, texts: list[str]) -> list[np.ndarray]:
    return TextTokenizer(load_spec(str(model_dir))).encode(texts).ids


def _query_check(ref: Target, model_dir: Path, texts: list[str]) -> Any:
    """Benchmark 5's replies (a sample, by text index) against the reference on the same ids."""
    import base64

    import orjson

    def check(samples: dict[int, bytes]) -> dict[str, float]:
        idx = sorted(samples)
        got = np.stack([np.frombuffer(base64.b64decode(orjson.loads(samples[i])["data"][0]["embedding"]), "<f4")
                        for i in idx])
        want = ref.embed_ids(_tokenize_like_gateway(model_dir, [texts[i % len(texts)] for i in idx]))
        if got.shape != want.shape:
            return {"min_cosine": float("nan")}
        cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1) + 1e-12)
        return {"min_cosine": round(float(cos.min()), 6), "checked": len(idx)}

    return check


def _zero_check(shape: ModelShape) -> Any:
    """The no-op engine answers zero vectors of the model's dimension: check that much."""
    import base64

    import orjson

    def check(samples: dict[int, bytes]) -> dict[str, float]:
        vecs = [np.frombuffer(base64.b64decode(orjson.loads(b)["data"][0]["embedding"]), "<f4") for b in samples.values()]
        ok = all(v.shape == vecs[0].shape and not v.any() for v in vecs)
        return {"zero_vectors_ok": float(ok), "checked": len(vecs)}

    return check


class _Fixed(Target):
    """A target that returns precomputed rows (checks the text path against ids)."""

    name = "bouquet-http-text"

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows

    def embed_ids(self, seqs: list[np.ndarray]) -> np.ndarray:
        return self.rows


def _free_cuda() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def run_bench(opts: BenchOptions) -> tuple[dict[str, Any], list[Path]]:
    """Run everything; returns (results, files written)."""
    from bouquet.bench.report import write_all

    rate = R.measure_matmul_rate(opts.device)
    results: dict[str, Any] = {"meta": _meta(opts, rate), "models": {}}
    for name in opts.models:
        if Path(name).is_dir():
            shape = ModelShape.from_dir(Path(name))
        elif name not in SHAPES:
            raise ValueError(f"unknown model shape {name!r}; choose from {sorted(SHAPES)} or give a model directory")
        else:
            shape = tiny(SHAPES[name]) if opts.tiny else SHAPES[name]
        results["models"][shape.name] = bench_model(shape, opts, rate)
        write_all(results, opts.out, plots=False)  # partial results survive a later failure
    return results, write_all(results, opts.out)
