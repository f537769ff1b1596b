"""The `bouquet` command line (typer). Builds the one ServeConfig and hands it down."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from bouquet.bench.command import bench_app
from bouquet.layout import MAX_TOKENIZER_THREADS
from bouquet.config import (BODY_BYTES_PER_TOKEN, BODY_HEADROOM_BYTES, CPU_BATCH_TOKENS, GPU_BATCH_TOKENS, LOG_FORMAT,
                            MAX_BATCH_SEQS, ConfigError, ServeConfig)

# Plain (click) help: rich's option table cuts long option names at 80 columns ("--interactive-max-…").
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  context_settings={"max_content_width": 100, "help_option_names": ["-h", "--help"]}, help="bouquet: fast embedding and reranking server.")


def _print_version(value: bool) -> None:
    if value:
        from bouquet import __version__

        typer.echo(f"bouquet {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """bouquet: serve embedding and reranking models (gateway → gRPC replicas → packed engine)."""


def _default(name: str) -> Any:
    """ServeConfig's default for field ``name``: CLI defaults are the config's, never restated."""
    return _FIELDS[name].default


_FIELDS = {f.name: f for f in dataclasses.fields(ServeConfig)}

# The replica's engine and scheduling options, which `serve` (gateway + replicas) and `server` (one
# replica) share: CLI name → (type, ServeConfig field, option). ``_with_replica_options`` adds them
# to both commands, which receive them as one dict of config fields.
_REPLICA_OPTIONS: dict[str, tuple[Any, str, Any]] = {
    "model": (list[str], "models", typer.Option(
        [], metavar="DIR|ORG/NAME", envvar="BOUQUET_MODEL", help="Model directory or Hugging Face id (default: the embedded "
        "all-MiniLM-L6-v2). `serve` only: repeat to serve several models behind one endpoint, each with its own replicas "
        "(in $BOUQUET_MODEL: separated by spaces).")),
    "revision": (Optional[str], "revision", typer.Option(
        _default("revision"), help="Branch, tag or commit of a Hugging Face --model (same as --model ORG/NAME@REVISION).")),
    "allow_pickle": (bool, "allow_pickle", typer.Option(
        _default("allow_pickle"), "--allow-pickle", help="Load pickled weights (pytorch_model.bin) when a model has no "
        "safetensors, with torch.load(weights_only=True). Off: such models are refused.")),
    "dtype": (str, "dtype", typer.Option(
        _default("dtype"), envvar="BOUQUET_DTYPE", help="auto (bf16 on GPU; on CPU fp32 under int8 quantization, else bf16 where it has "
        "AVX512-BF16 or AMX, else fp32) | float32 | float16 | bfloat16")),
    "quantization": (str, "quantization", typer.Option(
        _default("quantization"), help="none | fp8 | int8. fp8: matmuls in fp8 e4m3 (weights per channel, activations per token) on every batch: "
        "decoders' MLP, encoders' q/k/v; "
        "int8 (CPU only): every matmul in int8 (weights per channel, activations per token); each refused when it moves the "
        "model's outputs (docs/quantization.md).")),
    "max_batch_tokens": (int, "max_batch_tokens", typer.Option(
        _default("max_batch_tokens"),
        help=f"Token budget per engine step (0 = auto: {GPU_BATCH_TOKENS} GPU, {CPU_BATCH_TOKENS} CPU).")),
    "max_batch_seqs": (int, "max_batch_seqs", typer.Option(_default("max_batch_seqs"), help="Sequence slots per engine step.")),
    "max_queue_tokens": (int, "max_queue_tokens", typer.Option(
        _default("max_queue_tokens"), help="Pending tokens per replica before requests get 429.")),
    "interactive_max_tokens": (int, "interactive_max_tokens", typer.Option(
        _default("interactive_max_tokens"),
        help="Requests without 'priority' of at most this many tokens are interactive, larger ones batch.")),
    "enforce_eager": (bool, "enforce_eager", typer.Option(_default("enforce_eager"), help="Disable CUDA graphs.")),
    "graph_max_tokens": (int, "graph_max_tokens", typer.Option(
        _default("graph_max_tokens"), help="CUDA graphs for batches of up to this many tokens; larger ones run eagerly.")),
    "triton_gemms": (bool, "triton_gemms", typer.Option(
        _default("triton_gemms"), "--triton-gemms/--no-triton-gemms",
        help="On Hopper GPUs, Triton GEMMs where measured faster than cuBLAS: split-K for steps of up to 256 tokens, "
        "gated MLPs' gate/up with the activation in its epilogue from 2,048, qkv / MLP-in with bias or activation "
        "up to 128 (--no-triton-gemms: none of them; "
        "other GPUs and the CPU never use them).")),
    "capture_bucket": (list[str], "capture_buckets", typer.Option(
        [], metavar="SEQS:TOKENS:MAX_SEQLEN[:uniform]", help="A CUDA-graph bucket 'seqs:tokens:max_seqlen' to capture at start-up (repeatable), "
        "instead of on its second use; equal lengths that fill it (e.g. 32:16384:512) also capture its uniform bucket "
        "('...:uniform', cuDNN attention).")),
    "bucket_stats": (Optional[str], "bucket_stats_path", typer.Option(
        _default("bucket_stats_path"), help="Bucket-hit histogram (JSON): its hot buckets are captured at start-up "
        "and it is rewritten at shutdown.")),
    "spin_wait": (bool, "spin_wait", typer.Option(
        _default("spin_wait"), "--spin-wait/--no-spin-wait",
        help="Wait for GPU results by spinning (lower batch-1 latency, one busy core per replica).")),
    "engine": (str, "engine", typer.Option(
        _default("engine"), help="torch (the model) | noop (benchmarking aid: loads the model's spec and tokenizer "
        "but runs no model; every input gets a zero vector of the model's dimension).")),
    "log_level": (str, "log_level", typer.Option(_default("log_level"), help="critical | error | warning | info | debug")),
}


def _with_replica_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` (whose first parameter is ``replica: dict[str, Any]``) the options of
    _REPLICA_OPTIONS as CLI parameters; it is called with their values as ServeConfig fields."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "replica"]
    shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=kind)
              for name, (kind, _, opt) in _REPLICA_OPTIONS.items()]

    @functools.wraps(command)
    def run(**values: Any) -> None:
        replica = {fld: values.pop(name) for name, (_, fld, _) in _REPLICA_OPTIONS.items()}
        replica["capture_buckets"] = tuple(replica["capture_buckets"])
        models = replica["models"]  # several only for `serve`; the first is ServeConfig.model
        replica["model"], replica["models"] = (models[0] if models else None), tuple(models) if len(models) > 1 else ()
        command(**values, replica=replica)

    # --model first in --help (what a new user looks for), then the command's own options
    model = [p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in shared if p.name == "model"]
    params = model + own + [p for p in shared if p.name != "model"]
    run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]  # what typer reads
    run.__annotations__ = {p.name: p.annotation for p in params}
    return run


def _api_key(given: str | None, key_file: Path | None) -> str | None:
    """The API key: ``--api-key`` (serve only), else ``--api-key-file`` (its content, less one
    trailing line break: ``echo KEY > file`` writes one), else $BOUQUET_API_KEY, else None. Read
    here rather than through click's envvar: click takes an empty variable for an unset one, and an
    empty key (a secret that did not mount) must be refused, not serve without authentication.
    An unreadable file or two sources at once end the command with exit code 2."""
    if key_file is not None:
        if given is not None:
            typer.echo("error: give the API key once: --api-key or --api-key-file", err=True)
            raise typer.Exit(2)
        try:
            text = key_file.read_text()
        except (OSError, UnicodeDecodeError) as e:
            typer.echo(f"error: --api-key-file {key_file}: {e}", err=True)
            raise typer.Exit(2) from None
        return text.removesuffix("\n").removesuffix("\r")
    return given if given is not None else os.environ.get("BOUQUET_API_KEY")


def _config(**values: object) -> ServeConfig:
    """Build and validate the config; a bad value ends the command with exit code 2."""
    try:
        return ServeConfig(**values).validate()  # type: ignore[arg-type]
    except (ConfigError, ValueError, TypeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


@app.command(short_help="Run the HTTP gateway and its model replicas.")
@_with_replica_options
def serve(
    replica: dict[str, Any],
    served_model_name: list[str] = typer.Option([], metavar="NAME", help="Public model name(s); repeatable. One model: its names, the "
                                                "first being the id in replies. Several --model: one name per model, in order."),
    host: str = typer.Option(_default("host"), envvar="BOUQUET_HOST", help="Gateway bind address."),
    port: int = typer.Option(_default("port"), envvar="BOUQUET_PORT", help="Gateway HTTP port."),
    grpc_port: int = typer.Option(_default("grpc_port"), help="First replica's gRPC port (0 = pick free ports)."),
    device: str = typer.Option(_default("device"), envvar="BOUQUET_DEVICE", help="auto | cpu | cuda"),
    replicas: int = typer.Option(_default("replicas"), help="Server processes to start (CPU)."),
    gpus: str = typer.Option("", help="Comma-separated GPU indices: one replica per GPU (see --replicas-per-gpu)."),
    replicas_per_gpu: int = typer.Option(_default("replicas_per_gpu"), help="Replica processes sharing each GPU (or "
                                         "multiplying --replicas): more processes to spread the per-request host work "
                                         "of small requests. 0 = sized to the machine and model (logged at start, in /info)."),
    transport: str = typer.Option(_default("transport"), help="auto: a Unix socket to the replicas started here, gRPC "
                                  "to --server ones | grpc: gRPC to every replica."),
    server: list[str] = typer.Option([], metavar="HOST:PORT", help="Use running replicas at HOST:PORT (repeatable) instead of starting any."),
    chunk_tokens: int = typer.Option(_default("chunk_tokens"), help="Split large requests into chunks of about this many tokens."),
    gateway_workers: int = typer.Option(_default("gateway_workers"), help="Gateway worker processes (tokenization is "
                                        "CPU-bound); all share the replicas. 0 = the cores the replicas leave free "
                                        "(logged at start, in /info)."),
    tokenizer_threads: int = typer.Option(_default("tokenizer_threads"), help="Tokenizer threads per gateway worker "
                                          "(0 = the cores the replicas leave free, on the CPU cores / workers; at most "
                                          f"{MAX_TOKENIZER_THREADS})."),
    max_request_tokens: int = typer.Option(_default("max_request_tokens"), help="Most tokens per request, all its "
                                           "inputs together, after tokenization and truncation (413 beyond)."),
    max_request_bytes: int = typer.Option(_default("max_request_bytes"), help="Largest accepted request body (bytes); "
                                          f"0 = {BODY_BYTES_PER_TOKEN} per token of --max-request-tokens plus "
                                          f"{BODY_HEADROOM_BYTES} (token ids in JSON take up to {BODY_BYTES_PER_TOKEN} "
                                          "bytes each)."),
    max_output_bytes: int = typer.Option(_default("max_output_bytes"), help="Largest per-token output of a request "
                                         "(/embed_all, output multi_vector, bge-m3's heads), estimated before it "
                                         "runs (413 beyond)."),
    max_inputs: int = typer.Option(_default("max_inputs"), help="Most inputs per request."),
    timeout_keep_alive: float = typer.Option(_default("timeout_keep_alive"), help="Close idle HTTP keep-alive "
                                             "connections after this many seconds (keep it above your clients' idle expiry)."),
    drain_timeout: float = typer.Option(_default("drain_timeout"), help="On SIGTERM, seconds that requests in flight "
                                        "get to finish (new ones are answered 503); those still running then get 503 too."),
    # The HTTP front end's limits (docs/deploy.md); 408, 431, 414 and 503 answers close the connection.
    timeout_connect_idle: float = typer.Option(_default("timeout_connect_idle"), help="Close a new connection that sends nothing for this many seconds."),
    timeout_headers: float = typer.Option(_default("timeout_headers"), help="Seconds from a request's first byte to the end of its headers (else 408)."),
    timeout_body: float = typer.Option(_default("timeout_body"), help="Seconds from the end of a request's headers to the end of its body (else 408)."),
    timeout_read_gap: float = typer.Option(_default("timeout_read_gap"), help="Longest pause between two reads inside a request (else 408)."),
    max_header_bytes: int = typer.Option(_default("max_header_bytes"), help="Largest request line + header fields, bytes (else 431; 414 for a long target)."),
    max_header_count: int = typer.Option(_default("max_header_count"), help="Most header field lines per request (else 431)."),
    max_connections: int = typer.Option(_default("max_connections"), help="Open connections per gateway process; past it a request gets 503 with Retry-After."),
    # read by _api_key, not through click's envvar (an empty variable must be refused)
    api_key: Optional[str] = typer.Option(None, show_default=False,  # a secret: never printed
                                          help="Require 'Authorization: Bearer KEY' (all routes; /health without it "
                                               "says only its status) and send it to the replicas; default: "
                                               "$BOUQUET_API_KEY (preferred: command lines are public)."),
    api_key_file: Optional[Path] = typer.Option(None, metavar="FILE", help="Read the API key from this file (e.g. a "
                                                "mounted secret; one trailing line break is dropped)."),
    no_truncate: bool = typer.Option(not _default("truncate"), "--no-truncate",
                                     help="Refuse over-long inputs by default instead of truncating."),
    cors_allow_origin: list[str] = typer.Option([], metavar="ORIGIN", help="A browser origin (e.g. https://app.example.com, or *) "
                                                "allowed to call the API: answers CORS preflights. Repeatable; off by default."),
) -> None:
    """Run the gateway and its server replica(s) until Ctrl-C / SIGTERM."""
    api_key = _api_key(api_key, api_key_file)
    try:
        gpu_list = tuple(int(g) for g in gpus.split(",") if g.strip())
    except ValueError:
        typer.echo(f"error: --gpus must be comma-separated GPU indices, got {gpus!r}", err=True)
        raise typer.Exit(2) from None
    cfg = _config(
        **replica, served_model_name=tuple(served_model_name), host=host, port=port, grpc_port=grpc_port,
        device=device, replicas=replicas, gpus=gpu_list, replicas_per_gpu=replicas_per_gpu, transport=transport,
        servers=tuple(server), chunk_tokens=chunk_tokens, gateway_workers=gateway_workers, tokenizer_threads=tokenizer_threads,
        max_request_tokens=max_request_tokens, max_request_bytes=max_request_bytes, max_output_bytes=max_output_bytes,
        max_inputs=max_inputs, timeout_keep_alive=timeout_keep_alive,
        drain_timeout=drain_timeout, api_key=api_key, truncate=not no_truncate, cors_allow_origins=tuple(cors_allow_origin),
        timeout_connect_idle=timeout_connect_idle, timeout_headers=timeout_headers, timeout_body=timeout_body,
        timeout_read_gap=timeout_read_gap, max_header_bytes=max_header_bytes, max_header_count=max_header_count,
        max_connections=max_connections,
    )
    logging.basicConfig(level=cfg.log_level.upper(), format=LOG_FORMAT)
    from bouquet.parent import PARENT_PID_ENV, die_with_parent

    if PARENT_PID_ENV in os.environ:  # started by a tool that owns it (`bouquet bench`): die with that tool
        die_with_parent()
    from bouquet.launcher import serve as run

    try:
        code = run(cfg)
    except Exception as e:  # noqa: BLE001 - start-up errors end the command with a clear message
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


app.add_typer(bench_app, name="bench", short_help="Benchmark bouquet beside transformers (bench/README.md).")


@app.command(short_help="Embed files into vector shards (offline, resumable).")
def embed(
    input: str = typer.Argument(..., metavar="INPUT", help="A JSONL, CSV/TSV, Parquet or text file (one document per line), or a folder of them."),
    output: str = typer.Option(..., "--output", "-o", help="Output folder: part-NNNNN shards and _manifest.json."),
    model: Optional[str] = typer.Option(None, help="Model directory or Hugging Face id ORG/NAME[@REVISION] (default: the "
                                        "embedded all-MiniLM-L6-v2)."),
    revision: Optional[str] = typer.Option(None, help="Branch, tag or commit of a Hugging Face --model."),
    text_column: str = typer.Option("text", help="Column holding the documents (JSONL, CSV, Parquet)."),
    id_column: Optional[str] = typer.Option(None, help="Column holding row ids (default: 'id' when present, else the row index)."),
    format: str = typer.Option("parquet", "--format", help="parquet (id, vector) | npy (vectors + ids.parquet per shard)."),
    dtype: str = typer.Option("auto", envvar="BOUQUET_DTYPE", help="Compute dtype: auto (bf16 on GPU; on CPU fp32 under int8 "
                              "quantization, else bf16 where it has AVX512-BF16 or AMX, else fp32) | float32 | float16 | bfloat16."),
    output_dtype: str = typer.Option("float32", help="Stored vector dtype: float32 | float16."),
    quantization: str = typer.Option("none", help="none | fp8 | int8 (as `serve --quantization`: the layers' matmuls in fp8 e4m3; int8 on the CPU only)."),
    triton_gemms: bool = typer.Option(True, "--triton-gemms/--no-triton-gemms",
                                      help="As `serve --no-triton-gemms`: none of the engine's Triton GEMMs on Hopper."),
    device: str = typer.Option("auto", help="auto | cpu | cuda"),
    max_batch_tokens: int = typer.Option(0, help=f"Token budget per engine step (0 = auto: {GPU_BATCH_TOKENS} GPU, "
                                         f"{CPU_BATCH_TOKENS} CPU)."),
    max_batch_seqs: int = typer.Option(MAX_BATCH_SEQS, help="Sequence slots per engine step."),
    shard_rows: int = typer.Option(10_000, help="Input rows per output shard (the unit of resumption)."),
    tokenizer_threads: int = typer.Option(0, help="Tokenizer threads running alongside the engine (0 = auto: 2)."),
    threads: int = typer.Option(0, help="CPU engine: torch threads (0 = auto: half the cores; with --ray: per actor)."),
    prompt: Optional[str] = typer.Option(None, help="Text prefixed to every document (default: the model's default prompt)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Discard what the output folder holds instead of resuming."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar (rows/s, tokens/s, ETA)."),
    ray: bool = typer.Option(False, "--ray", help="Run on a Ray cluster through Ray Data (needs the ray extra: pip install 'bouquet[ray]')."),
    address: Optional[str] = typer.Option(None, help="Ray cluster address (with --ray); none = start a local Ray."),
    workers: int = typer.Option(0, help="With --ray: engine actors (0 = one per GPU, or 2 on CPU)."),
    log_level: str = typer.Option("warning", help="critical | error | warning | info | debug"),
) -> None:
    """Embed every document of INPUT into OUTPUT: streaming, resumable, tokenization alongside the engine."""
    from bouquet.config import LOG_LEVELS
    from bouquet.jobs.embed_job import EmbedJobConfig

    if log_level.lower() not in LOG_LEVELS:
        typer.echo(f"error: --log-level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}", err=True)
        raise typer.Exit(2)

    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT)
    try:
        from bouquet.modelspec import resolve_model_path

        if model is not None:  # a Hub model is fetched here, once (progress on stderr)
            model = str(resolve_model_path(model, revision, download=True))
        cfg = EmbedJobConfig(
            input=input, output=output, model=model, text_column=text_column, id_column=id_column,
            format=format, dtype=dtype, output_dtype=output_dtype, quantization=quantization,  # type: ignore[arg-type]
            triton_gemms=triton_gemms, device=device,
            max_batch_tokens=max_batch_tokens, max_batch_seqs=max_batch_seqs, shard_rows=shard_rows,
            tokenizer_threads=tokenizer_threads, threads=threads, prompt=prompt, overwrite=overwrite, progress=progress,
        ).validate()
        if address is not None and not ray:
            raise ValueError("--address needs --ray")
        if ray:
            from bouquet.jobs.ray_job import run_ray_job

            stats = run_ray_job(cfg, address=address, workers=workers)
        else:
            from bouquet.jobs.embed_job import reserve_cores_for_engine, run_embed_job

            reserve_cores_for_engine()  # before the first tokenization (rayon reads it once)
            stats = run_embed_job(cfg)
    except (ValueError, ImportError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2 if isinstance(e, ValueError) else 1) from None
    except KeyboardInterrupt:
        typer.echo(f"interrupted: the finished shards stay in {output}; the same command resumes from them", err=True)
        raise typer.Exit(130) from None
    if stats.shards_written == 0 and stats.shards_skipped:  # a finished job run again: no rates of nothing
        typer.echo(f"nothing to embed: the job in {output} is complete; 0 shards written, "
                   f"{stats.shards_skipped} already done", err=True)
        return
    # The Ray path does not count tokens (they stay inside the actors): say so rather than print 0.
    tokens = f"{stats.tokens} tokens" if stats.tokens else "tokens not counted"
    tok_rate = f"{stats.tokens_per_s:,.0f} tokens/s" if stats.tokens else "tokens/s n/a"
    secs = f"{stats.seconds:.1f}s" if stats.seconds >= 10 else f"{stats.seconds:.3g}s"  # a small job: not "0.0s"
    typer.echo(f"embedded {stats.rows} rows ({tokens}) in {secs}: {stats.rows_per_s:,.0f} rows/s, "
               f"{tok_rate}; {stats.shards_written} shards written, {stats.shards_skipped} already done", err=True)


@app.command("server", short_help="Run one gRPC replica for a remote gateway.")
@_with_replica_options
def server_cmd(
    replica: dict[str, Any],
    host: str = typer.Option("127.0.0.1", help="gRPC bind address; 0.0.0.0 to serve gateways on other machines "
                             "(give it an API key, and keep it on a private network: gRPC here is plaintext)."),
    api_key_file: Optional[Path] = typer.Option(None, metavar="FILE", help="Require this API key ('authorization: "
                                                "Bearer KEY' metadata) on every call but health; default: "
                                                "$BOUQUET_API_KEY, else no key. Never on the command line."),
    port: int = typer.Option(50051, help="gRPC port."),
    served_model_name: list[str] = typer.Option([], metavar="NAME", help="Public model name(s); must match the gateway's."),
    device: str = typer.Option(_default("device"), envvar="BOUQUET_DEVICE", help="auto | cpu | cuda | cuda:N"),
) -> None:
    """Run ONE server replica (gRPC) on HOST:PORT for gateways elsewhere (`bouquet serve --server HOST:PORT`)."""
    if replica["models"]:
        typer.echo("error: `bouquet server` serves one --model (start one server per model)", err=True)
        raise typer.Exit(2)
    cfg = _config(**replica, served_model_name=tuple(served_model_name), host=host, grpc_port=port,
                  device=device.split(":")[0], api_key=_api_key(None, api_key_file))
    logging.basicConfig(level=cfg.log_level.upper(), format=LOG_FORMAT)
    from bouquet.launcher import serve_replica

    try:
        code = serve_replica(cfg, device)
    except ValueError as e:  # the model: not found on the Hub, not cached, pickled weights refused
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


def main() -> None:
    app(prog_name="bouquet")


if __name__ == "__main__":
    main()
