"""The `bouquet` command line (typer). Builds the one ServeConfig and hands it down."""
from __future__ import annotations

import logging
import os
import sys
from typing import Optional

import typer

from bouquet.config import ConfigError, ServeConfig

app = typer.Typer(add_completion=False, no_args_is_help=True, help="bouquet: fast embedding and reranking server.")


@app.callback()
def _root() -> None:
    """bouquet: serve embedding and reranking models (gateway → gRPC replicas → packed engine)."""


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"BOUQUET_{name}", default)


# Options that `serve` (gateway + replicas) and `server` (one replica) share: the replica's engine
# and scheduling settings.
_MODEL = typer.Option(_env("MODEL"), help="Model directory or Hugging Face id (default: the embedded all-MiniLM-L6-v2).")
_DTYPE = typer.Option("auto", help="auto (bf16 on GPU, fp32 on CPU) | float32 | float16 | bfloat16")
_MAX_BATCH_TOKENS = typer.Option(0, help="Token budget per engine step (0 = auto: 16384 GPU, 2048 CPU).")
_MAX_BATCH_SEQS = typer.Option(512, help="Sequence slots per engine step.")
_MAX_QUEUE_TOKENS = typer.Option(4_000_000, help="Pending tokens per replica before requests get 429.")
_INTERACTIVE_MAX_TOKENS = typer.Option(
    2048, help="Requests without 'priority' of at most this many tokens are interactive, larger ones batch.")
_ENFORCE_EAGER = typer.Option(False, help="Disable CUDA graphs.")


def _config(**values: object) -> ServeConfig:
    """Build and validate the config; a bad value ends the command with exit code 2."""
    try:
        return ServeConfig(**values).validate()  # type: ignore[arg-type]
    except (ConfigError, ValueError, TypeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


@app.command()
def serve(
    model: Optional[str] = _MODEL,
    served_model_name: list[str] = typer.Option([], help="Public model name(s); repeatable. The first is the id in replies."),
    host: str = typer.Option(_env("HOST", "127.0.0.1"), help="Gateway bind address."),
    port: int = typer.Option(int(_env("PORT", "8000") or 8000), help="Gateway HTTP port."),
    grpc_port: int = typer.Option(0, help="First replica's gRPC port (0 = pick free ports)."),
    device: str = typer.Option(_env("DEVICE", "auto"), help="auto | cpu | cuda"),
    dtype: str = _DTYPE,
    max_batch_tokens: int = _MAX_BATCH_TOKENS,
    max_batch_seqs: int = _MAX_BATCH_SEQS,
    max_queue_tokens: int = _MAX_QUEUE_TOKENS,
    interactive_max_tokens: int = _INTERACTIVE_MAX_TOKENS,
    replicas: int = typer.Option(1, help="Server processes to start (CPU)."),
    gpus: str = typer.Option("", help="Comma-separated GPU indices: one replica per GPU."),
    server: list[str] = typer.Option([], help="Use running replicas at HOST:PORT (repeatable) instead of starting any."),
    chunk_tokens: int = typer.Option(8192, help="Split large requests into chunks of about this many tokens."),
    gateway_workers: int = typer.Option(1, help="Gateway worker processes (tokenization is CPU-bound); all share the replicas."),
    max_request_bytes: int = typer.Option(2 * 1024 * 1024, help="Largest accepted request body (bytes)."),
    max_inputs: int = typer.Option(4096, help="Most inputs per request."),
    api_key: Optional[str] = typer.Option(_env("API_KEY"), help="Require 'Authorization: Bearer KEY' (all routes but /health)."),
    no_truncate: bool = typer.Option(False, "--no-truncate", help="Refuse over-long inputs by default instead of truncating."),
    enforce_eager: bool = _ENFORCE_EAGER,
    log_level: str = typer.Option("info"),
) -> None:
    """Run the gateway and its server replica(s) until Ctrl-C / SIGTERM."""
    try:
        gpu_list = tuple(int(g) for g in gpus.split(",") if g.strip())
    except ValueError:
        typer.echo(f"error: --gpus must be comma-separated GPU indices, got {gpus!r}", err=True)
        raise typer.Exit(2) from None
    cfg = _config(
        model=model, served_model_name=tuple(served_model_name), host=host, port=port, grpc_port=grpc_port,
        device=device, dtype=dtype, max_batch_tokens=max_batch_tokens, max_batch_seqs=max_batch_seqs,
        max_queue_tokens=max_queue_tokens, interactive_max_tokens=interactive_max_tokens, replicas=replicas,
        gpus=gpu_list, servers=tuple(server), chunk_tokens=chunk_tokens, gateway_workers=gateway_workers,
        max_request_bytes=max_request_bytes, max_inputs=max_inputs, api_key=api_key, truncate=not no_truncate,
        enforce_eager=enforce_eager, log_level=log_level,
    )
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from bouquet.launcher import serve as run

    try:
        code = run(cfg)
    except Exception as e:  # noqa: BLE001 - start-up errors end the command with a clear message
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


@app.command("server")
def server_cmd(
    host: str = typer.Option("0.0.0.0", help="gRPC bind address."),
    port: int = typer.Option(50051, help="gRPC port."),
    model: Optional[str] = _MODEL,
    served_model_name: list[str] = typer.Option([], help="Public model name(s); must match the gateway's."),
    device: str = typer.Option(_env("DEVICE", "auto"), help="auto | cpu | cuda | cuda:N"),
    dtype: str = _DTYPE,
    max_batch_tokens: int = _MAX_BATCH_TOKENS,
    max_batch_seqs: int = _MAX_BATCH_SEQS,
    max_queue_tokens: int = _MAX_QUEUE_TOKENS,
    interactive_max_tokens: int = _INTERACTIVE_MAX_TOKENS,
    enforce_eager: bool = _ENFORCE_EAGER,
    log_level: str = typer.Option("info"),
) -> None:
    """Run ONE server replica (gRPC) on HOST:PORT for gateways elsewhere (`bouquet serve --server HOST:PORT`)."""
    cfg = _config(
        model=model, served_model_name=tuple(served_model_name), host=host, grpc_port=port,
        device=device.split(":")[0], dtype=dtype, max_batch_tokens=max_batch_tokens, max_batch_seqs=max_batch_seqs,
        max_queue_tokens=max_queue_tokens, interactive_max_tokens=interactive_max_tokens,
        enforce_eager=enforce_eager, log_level=log_level,
    )
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from bouquet.launcher import serve_replica

    raise typer.Exit(serve_replica(cfg, device))


def main() -> None:
    app(prog_name="bouquet")


if __name__ == "__main__":
    main()
