"""`bouquet bench`: the benchmark suites (bench/README.md, bouquet/bench/suites.py) against bouquet,
its no-op engine, the transformers baseline and other servers, side by side. ``bouquet bench
[--suite NAME] [options]`` runs a load suite; ``bouquet bench TOOL ARGS`` a tool suite with its own
arguments; ``bouquet bench suites`` lists both. This is the command's options only, registered by
bouquet/cli.py; the suites live in bouquet/bench/."""
from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Optional

import typer

from bouquet.bench.suites import LOAD_SUITES, TOOL_SUITES, suites_table
from bouquet.config import LOG_FORMAT

bench_app = typer.Typer(invoke_without_command=True, no_args_is_help=False, add_completion=False,
                        help="Benchmark bouquet beside transformers and other servers (bench/README.md).")


@bench_app.callback()
def bench(
    ctx: typer.Context,
    suite: str = typer.Option("writeup", help="Load suite: " + "; ".join(f"{k} ({v.what})" for k, v in LOAD_SUITES.items())
                              + ". It picks --benchmarks and --system where they are not given. Tool suites: `bouquet bench suites`."),
    model: list[str] = typer.Option(["bge-base"], metavar="SHAPE|DIR", help="Model shape(s), random weights: a name of bouquet/bench/models.py SHAPES (bge-base, minilm, "
                                    "qwen3-0.6b, mpnet-base, modernbert-base, distilbert, roberta-large, gte-qwen2-1.5b, e5-mistral-7b, "
                                    "embeddinggemma-300m); "
                                    "or a model directory (its own weights and tokenizer). Repeatable."),
    system: list[str] = typer.Option([], metavar="NAME",
                                     help="Systems: engine (in process) | engine-fp8 (the same, --quantization fp8) | engine-cublas, engine-fp8-cublas (none of the engine's Triton GEMMs, as serve --no-triton-gemms: split-K and qkv / MLP-in for small steps, gate/up + activation for large ones; the same as engine on the CPU) | replica, replica-fp8 (in process, stepped as a served replica steps it: its scheduler, token budget and two steps in flight; engine runs a whole request as one step) | grpc | http | http-fp8 (serve --quantization fp8) | http-cublas (serve --no-triton-gemms) | http-noop (bouquet serve --engine "
                                     "noop) | openai | rerank-url (--rerank-url, rerank benchmark only) | transformers. Repeatable (default: the suite's)."),
    benchmarks: str = typer.Option("", help="Comma-separated: 1,2,3,mixed,4 (bench/README.md), 5 (online queries), rerank (one query against N documents, /v1/rerank); or cpu alone: all-MiniLM-L6-v2 on the CPU against sentence-transformers and ONNX Runtime (systems: bouquet/bench/cpu.py). Default: the suite's."),
    device: str = typer.Option("cuda", help="cuda | cpu"),
    out: Path = typer.Option(Path("bench/out"), help="Folder for results.json, results.md and the plots."),
    models_root: Optional[Path] = typer.Option(None, help="Where random-weight model folders are built (default OUT/models)."),
    tokenizer: Optional[Path] = typer.Option(None, help="tokenizer.json to put in the model folders (default: all-MiniLM-L6-v2's)."),
    tiny: bool = typer.Option(False, help="Small copies of the shapes (CPU smoke runs)."),
    seconds: float = typer.Option(3.0, help="Time per case (at least --min-iters requests)."),
    min_iters: int = typer.Option(5, help="Benchmarks 1, 2 and 4: at least this many timed requests per case."),
    warmup: int = typer.Option(3, help="Untimed requests before each latency case."),
    warmup_seconds: float = typer.Option(1.0, help="Benchmarks 3 and 4: seconds of the same load, untimed, before each case."),
    mixed_range: str = typer.Option("16,512", help="Mixed-length benchmark: lowest,highest length."),
    lat_lengths: str = typer.Option("128,512,4096", help="Benchmark 1 lengths (longer than the model allows are skipped)."),
    thr_lengths: str = typer.Option("512,1024,4096", help="Benchmark 3 lengths."),
    score_batches: str = typer.Option("5,25,50", help="Benchmark 2: sequences per request (comma-separated)."),
    score_len: int = typer.Option(512, help="Benchmark 2 sequence length."),
    conc_len: int = typer.Option(512, help="Benchmark 4 text length, tokens."),
    thr_batch: int = typer.Option(100, help="Benchmark 3 (and mixed): sequences per request."),
    concurrency: str = typer.Option("1,2,4,8,16", help="Benchmark 4 client counts."),
    grpc_address: Optional[str] = typer.Option(None, help="Use this bouquet replica (HOST:PORT) instead of starting one."),
    http_url: Optional[str] = typer.Option(None, help="Use this bouquet gateway instead of starting one."),
    openai_url: Optional[str] = typer.Option(None, help="Any OpenAI-compatible base URL (system 'openai')."),
    openai_model: Optional[str] = typer.Option(None, help="The 'model' field sent to --openai-url (default: none sent)."),
    commit: Optional[str] = typer.Option(None, help="Commit to record (default: git rev-parse)."),
    gateway_workers: int = typer.Option(0, help="Gateway worker processes of the HTTP server the bench starts (0: as `serve` chooses)."),
    replicas_per_gpu: int = typer.Option(0, help="Replica processes per GPU of the HTTP server the bench starts (0: as `serve` chooses)."),
    query_clients: str = typer.Option("64,256", help="Benchmark 5: client processes (one keep-alive connection each)."),
    query_tokens: str = typer.Option("16,64", help="Benchmark 5: generated text lengths, lowest,highest tokens."),
    query_texts: Optional[Path] = typer.Option(None, help="Benchmark 5: a file of texts, one per line, instead of generated ones."),
    rerank_docs: str = typer.Option("20,100", help="Rerank benchmark: documents per request (comma-separated)."),
    rerank_doc_tokens: int = typer.Option(250, help="Rerank benchmark: tokens per document."),
    rerank_clients: str = typer.Option("1,4", help="Rerank benchmark: client counts."),
    rerank_url: Optional[str] = typer.Option(None, help="Any server with a Cohere-shaped /v1/rerank (system 'rerank-url')."),
    rerank_model: Optional[str] = typer.Option(None, help="The 'model' field sent to --rerank-url (default: none sent)."),
    baseline: Optional[Path] = typer.Option(None, help="results.json of an earlier run (e.g. the same suite from an old commit's checkout): "
                                            "results.md gets each row beside it with the ratio."),
    history: Optional[Path] = typer.Option(None, help="Append this run's figures to this CSV (bench/results/history.csv: one row per figure)."),
    rounds: int = typer.Option(1, help="CPU suite: run every system this many times, round after round; each timing is "
                               "the median of its rounds, shown with the lowest and highest (a shared machine drifts "
                               "±15% between runs)."),
) -> None:
    """Run a load suite (bench/README.md) against bouquet and the transformers baseline, side by side."""
    if ctx.invoked_subcommand is not None:  # a tool suite or `suites`: its own arguments
        return
    if suite not in LOAD_SUITES:
        typer.echo(f"error: unknown --suite {suite!r} (load suites: {', '.join(LOAD_SUITES)}; tool suites run as "
                   f"`bouquet bench NAME`: {', '.join(TOOL_SUITES)})", err=True)
        raise typer.Exit(2)
    if baseline is not None and not baseline.is_file():
        typer.echo(f"error: --baseline {str(baseline)!r} is not a file", err=True)
        raise typer.Exit(2)
    benchmarks = benchmarks or ",".join(LOAD_SUITES[suite].benchmarks)
    if benchmarks == "cpu":  # its own systems (bouquet/bench/cpu.py), whatever --suite's are
        _cpu_suite(system, out, tiny, history, rounds)
        return
    system = system or list(LOAD_SUITES[suite].systems)
    if device not in ("cuda", "cpu"):
        typer.echo(f"error: --device must be cuda or cpu, got {device!r}", err=True)
        raise typer.Exit(2)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            typer.echo("error: --device cuda (the default): torch sees no CUDA device; on a CPU use --device cpu "
                       "(with --tiny for a quick run)", err=True)
            raise typer.Exit(2)
    from bouquet.bench.driver import BENCHMARKS, SYSTEMS, BenchOptions, run_bench
    from bouquet.bench.models import SHAPES
    from bouquet.bench.rerank import RerankSettings
    from bouquet.bench.run import Settings

    # Every name checked before any model is built or server started.
    bad = ([f"--system {x!r} (choose from {', '.join(SYSTEMS)})" for x in system if x not in SYSTEMS]
           + [f"--model {x!r} (a shape of {', '.join(SHAPES)}, or a model directory)" for x in model
              if x not in SHAPES and not Path(x).is_dir()]
           + [f"--benchmarks {x!r} (choose from {', '.join(BENCHMARKS)})" for x in benchmarks.split(",") if x not in BENCHMARKS])
    if bad:
        typer.echo("error: unknown " + "; ".join(bad), err=True)
        raise typer.Exit(2)
    logging.basicConfig(level="INFO", format=LOG_FORMAT)

    def ints(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in text.split(",") if x.strip())

    settings = Settings(lat_lengths=ints(lat_lengths), score_batches=ints(score_batches), thr_lengths=ints(thr_lengths),
                        score_len=score_len, conc_len=conc_len, thr_batch=thr_batch, concurrency=ints(concurrency), seconds=seconds, min_iters=min_iters,
                        warmup=warmup, warmup_s=warmup_seconds, mixed=ints(mixed_range)[:2],  # type: ignore[arg-type]
                        query_clients=ints(query_clients), query_tokens=ints(query_tokens)[:2])  # type: ignore[arg-type]
    opts = BenchOptions(models=tuple(model), systems=tuple(system), benchmarks=tuple(benchmarks.split(",")), device=device,
                        out=out, models_root=models_root or out / "models", tokenizer=tokenizer, tiny=tiny,
                        settings=settings, grpc_address=grpc_address, http_url=http_url, openai_url=openai_url,
                        openai_model=openai_model, commit=commit, gateway_workers=gateway_workers,
                        replicas_per_gpu=replicas_per_gpu, query_texts=query_texts, rerank_url=rerank_url,
                        rerank_model=rerank_model, rerank=RerankSettings(ints(rerank_docs), rerank_doc_tokens,
                                                                         clients=ints(rerank_clients)))
    # SIGTERM (a job runner's stop, `timeout`) unwinds the run like Ctrl-C, so the servers it started are
    # stopped by their finally blocks instead of outliving it (Python's default SIGTERM skips them).
    signal.signal(signal.SIGTERM, _exit_on_signal)
    results, files = run_bench(opts)
    _record(results, out, baseline, history)
    typer.echo((out / "results.md").read_text())
    for f in files:
        typer.echo(f"wrote {f}")
    if any(m["errors"] for m in results["models"].values()):
        raise typer.Exit(1)


def _record(results: dict, out: Path, baseline: Optional[Path], history: Optional[Path]) -> None:
    """The run set against ``baseline`` (appended to results.md) and appended to ``history``."""
    import orjson

    from bouquet.bench.history import append_history, compare, history_rows

    if baseline is not None:
        table = compare(results, orjson.loads(baseline.read_bytes()))
        with (out / "results.md").open("a") as f:
            f.write("\n" + (table or f"No row of this run is in the baseline {baseline}.\n"))
    if history is not None:
        append_history(history, history_rows(results, str(out / "results.json")))


@bench_app.command("suites")
def suites() -> None:
    """List every suite and the command that runs it."""
    typer.echo(suites_table())


def _tool(name: str, module: str, what: str) -> None:
    def run(ctx: typer.Context) -> None:
        import importlib
        import sys

        # argparse names the program after sys.argv[0]: its usage and errors then read `bouquet bench
        # NAME ...`, the command the user typed, instead of `bouquet ...`.
        sys.argv[0] = f"bouquet bench {name}"
        code = importlib.import_module(f"bouquet.bench.tools.{module}").main(list(ctx.args))
        raise typer.Exit(code or 0)

    run.__doc__ = what
    # every argument, --help included, goes to the tool's own parser
    bench_app.command(name, help=what, add_help_option=False,
                      context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run)


for _name, (_module, _device, _what) in TOOL_SUITES.items():
    _tool(_name, _module, f"{_what} ({_device}).")


def _cpu_suite(system: list[str], out: Path, tiny: bool, history: Optional[Path], rounds: int = 1) -> None:
    """`--benchmarks cpu`: every CPU system unless --system names some (bouquet/bench/cpu.py);
    --tiny: the first 16 STSb pairs and 8 batch-1 calls (a smoke run); ``history``: the CSV its
    figures are appended to; ``rounds``: runs of every system, alternating (cpu.run_suite)."""
    from bouquet.bench.cpu import CPU_SYSTEMS, missing_packages, run_suite
    from bouquet.bench.history import append_history, cpu_history_rows

    chosen = tuple(system) or CPU_SYSTEMS
    bad = [s for s in chosen if s not in CPU_SYSTEMS]
    if bad:
        typer.echo(f"error: unknown --system {', '.join(bad)} for --benchmarks cpu (choose from {', '.join(CPU_SYSTEMS)})",
                   err=True)
        raise typer.Exit(2)
    missing = missing_packages(chosen)
    if missing:
        typer.echo(f"error: --benchmarks cpu needs {', '.join(missing)} (the test extra: pip install -e '.[bench,test]', "
                   "or make bench-cpu)", err=True)
        raise typer.Exit(2)
    if rounds < 1:
        typer.echo(f"error: --rounds must be at least 1, got {rounds}", err=True)
        raise typer.Exit(2)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    record = run_suite(chosen, out, sentences=16 if tiny else 0, b1=8 if tiny else 200, rounds=rounds)
    typer.echo((out / "cpu-results.md").read_text())
    if history is not None:
        append_history(history, cpu_history_rows(record, str(out / "cpu-results.json")))
    if any("error" in r for r in record["systems"].values()):
        raise typer.Exit(1)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


