"""Entry point of one server replica process.

Two ways in: ``bouquet serve`` spawns ``python -m bouquet.server --config JSON ...`` per replica
(bound to loopback, dying with its parent); ``bouquet server --host H --port P`` runs one
standalone replica for a gateway on another machine (see docs/deploy.md).

Binds its gRPC port first (so the gateway can see it loading), then loads the model, runs a
warm-up batch and only then reports ready. Writes the bound port to ``--port-file``. Exits on
SIGTERM after draining in-flight requests, and dies with its parent (PR_SET_PDEATHSIG on Linux)
so that a killed launcher leaves no orphan holding a GPU.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import shutil
import signal
import sys
from typing import TYPE_CHECKING

import grpc

from bouquet.config import LOG_FORMAT, ServeConfig, batch_token_budget
from bouquet.modelspec import ModelSpec, load_spec
from bouquet.parent import die_with_parent
from bouquet.proto.rpc import SERVER_OPTIONS, ApiKeyInterceptor, add_health, add_servicer
from bouquet.server.service import InferenceService

if TYPE_CHECKING:
    from bouquet.engine.runtime.contract import StepEngine

log = logging.getLogger("bouquet.server")


async def serve(cfg: ServeConfig, port_file: str | None, device: str | None, bind_host: str = "127.0.0.1",
                ipc_path: str | None = None) -> None:
    """Bind ``bind_host:cfg.grpc_port`` (0 = a free port) and, when given, the Unix socket
    ``ipc_path`` for gateway workers on this host (server/ipc_server.py); load the model, serve
    until SIGTERM."""
    spec = load_spec(cfg.model, cfg.served_model_name[0] if cfg.served_model_name else None)
    if cfg.engine == "noop":
        # No model and no device: batch as a GPU replica does, so the scheduler packs alike.
        service = InferenceService(cfg, spec, batch_token_budget(cfg.max_batch_tokens, "cuda"), depth=2)
    else:
        import torch  # the server process is where torch lives; imported after argument parsing

        from bouquet.engine.runtime.engine import resolve_device

        dev = resolve_device(device or cfg.device)
        if dev.type == "cuda" and dev.index is not None:
            # Triton kernels, CUDA graphs and streams use the *current* device: make it this replica's
            # GPU (without this a replica on cuda:1 launched Triton kernels on cuda:0 and failed).
            torch.cuda.set_device(dev)
        if dev.type == "cpu" and os.environ.get("OMP_NUM_THREADS") is None:
            torch.set_num_threads(max(1, torch.get_num_threads()))
        service = InferenceService(cfg, spec, batch_token_budget(cfg.max_batch_tokens, dev.type), depth=2 if dev.type == "cuda" else 1)
    # With an API key every call but health must carry it (proto/rpc.py); the Unix socket is guarded
    # by its folder's and its own file modes instead (ipc_server.py).
    server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=[ApiKeyInterceptor(cfg.api_key)] if cfg.api_key else None)
    add_servicer(server, service)
    add_health(server, lambda: service.ready and not service.draining)
    try:
        port = server.add_insecure_port(f"{bind_host}:{cfg.grpc_port}")
    except RuntimeError:  # gRPC says only "Failed to bind", with no errno: name both causes
        raise ValueError(f"gRPC cannot listen on {bind_host}:{cfg.grpc_port}: the port is in use, or the host is "
                         "not an address of this machine") from None
    await server.start()
    ipc_server = None
    if ipc_path:
        from bouquet.server.ipc_server import IpcServer

        ipc_server = IpcServer(service, ipc_path)
        await ipc_server.start()
    if port_file:
        tmp = port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.replace(tmp, port_file)
    log.info("server: gRPC on port %d%s, loading %s (task %s%s)", port, f", IPC on {ipc_path}" if ipc_path else "",
             spec.path, spec.task, f": {spec.task_reason}" if spec.task_reason else "")
    loop_task = asyncio.create_task(service.run())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            loop.add_signal_handler(sig, stop.set)
    try:
        engine = await service.on_step_thread(build_engine, cfg, spec, device)
        await service.on_step_thread(engine.warmup)
    except BaseException:
        # Stopped here, on its loop: a gRPC server left to the garbage collector prints a traceback.
        await server.stop(grace=0)
        if ipc_server is not None:
            ipc_server.close()
        loop_task.cancel()
        raise
    service.attach(engine)
    # Everything allocated so far (torch, the model, graphs) lives as long as the process: keep it
    # out of every later garbage collection, whose full passes otherwise scan it again and again.
    gc.collect()
    gc.freeze()
    log.info("server: ready (%s, %s, attention=%s)", engine.info.device, engine.info.dtype, engine.info.attention)
    await stop.wait()
    log.info("server: draining")
    await service.drain(timeout_s=30)
    await server.stop(grace=5)
    if ipc_server is not None:
        ipc_server.close()
    loop_task.cancel()
    engine.shutdown()


def build_engine(cfg: ServeConfig, spec: ModelSpec, device: str | None) -> "StepEngine":
    """The replica's engine: the model on ``device`` (or the config's), or the no-op engine."""
    if cfg.engine == "noop":
        from bouquet.engine.runtime.noop import NoopEngine

        return NoopEngine(spec)
    from bouquet.engine.runtime.engine import Engine, GraphOptions
    from bouquet.engine.models.weights import load_weights

    # Without --allow-pickle the engine reads safetensors itself; with it the checkpoint may be pickled.
    state = load_weights(spec.path, allow_pickle=True) if cfg.allow_pickle else None
    return Engine(spec, device or cfg.device, cfg.dtype, state=state, graphs=GraphOptions.from_config(cfg),
                  spin_wait=cfg.spin_wait, quantization=cfg.quantization, triton_gemms=cfg.triton_gemms)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bouquet.server")
    ap.add_argument("--config", required=True, help="ServeConfig as JSON")
    ap.add_argument("--port-file", default=None)
    ap.add_argument("--device", default=None, help="overrides the config's device, e.g. cuda:1")
    ap.add_argument("--host", default="127.0.0.1", help="gRPC bind address (the config's grpc_port is the port)")
    ap.add_argument("--ipc-path", default=None, help="also serve gateway workers on this host on this Unix socket")
    ap.add_argument("--standalone", action="store_true", help="keep running when the parent process exits")
    ap.add_argument("--api-key-stdin", action="store_true",
                    help="read the API key from the first line of stdin (never from the command line or environment)")
    args = ap.parse_args(argv)
    cfg = ServeConfig.from_json(args.config)
    if args.api_key_stdin:
        # `bouquet serve` writes the key into a pipe and closes it: nothing else can read it there
        # (a command line is public in /proc; an environment is inherited by every child).
        cfg = cfg.replace(api_key=sys.stdin.readline().removesuffix("\n"))
    logging.basicConfig(level=cfg.log_level.upper(), format=LOG_FORMAT)
    if not args.standalone:
        die_with_parent()  # again (server/__main__.py did it first): main() may be called directly
        # Ctrl-C reaches the whole process group: the launcher stops its replicas (SIGTERM) once
        # the gateway has drained, and the requests still in flight need them until then.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    failed = False
    try:
        run_async(serve(cfg, args.port_file, args.device, args.host, args.ipc_path))
    except ValueError as e:  # the user's choices (device, dtype, model, quantization): one line, no traceback
        failed = True
        if args.port_file:  # the launcher reports it as the command's error (launcher.ReplicaProcess.error)
            with open(args.port_file + ".error", "w") as f:
                f.write(str(e))
        else:
            log.error("server: cannot start: %s", e, exc_info=cfg.log_level.lower() == "debug")
        sys.exit(1)
    finally:
        if args.port_file and not args.standalone:
            remove_work_files(args.port_file, args.ipc_path, launcher_gone=os.getppid() != parent, failed=failed)


def remove_work_files(port_file: str, ipc_path: str | None, launcher_gone: bool, failed: bool) -> None:
    """A launched replica's files in the launcher's work folder, as the replica stops. The launcher
    removes the folder after its replicas stop, but a launcher killed with SIGKILL cannot: so each
    replica removes its own port file and socket and then the folder once it is empty (the last
    replica out), and the whole folder when the launcher is already gone. A failed start keeps its
    files (the launcher reads ``PORT_FILE.error``) unless nobody is left to read them.

    Why not only when the launcher is gone: ``PR_SET_PDEATHSIG`` stops a replica as the launcher's
    threads die, and ``getppid()`` can still name the dying launcher then (tests/integration/test_lifecycle.py,
    SIGKILL with 2 gateway workers, left the folder in about one run in three)."""
    folder = os.path.dirname(port_file)
    if launcher_gone:
        shutil.rmtree(folder, ignore_errors=True)
        return
    if failed:
        return
    for path in (port_file, ipc_path):
        if path:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    try:
        os.rmdir(folder)
    except OSError:  # another replica's files are still there, or the launcher removed it first
        pass


def run_async(coro: "asyncio.Future[None] | object") -> None:
    """Run on uvloop when it is installed, else asyncio's default loop."""
    try:
        import uvloop

        uvloop.run(coro)  # type: ignore[arg-type]
    except ImportError:
        asyncio.run(coro)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
