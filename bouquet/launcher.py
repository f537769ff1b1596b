"""`bouquet serve`: start the server replica processes, then the gateway, and stop them together.
(`bouquet server` — one standalone replica for a remote gateway — is ``serve_replica``.)

The gateway runs in this process (uvicorn; SIGINT/SIGTERM start a drain, gateway/drain.py), or in
``--gateway-workers`` uvicorn worker processes supervised from here; replicas are child
processes (``python -m bouquet.server``) that also die with this process (PR_SET_PDEATHSIG).
When every replica of a model has exited on its own, the gateway stops too and the command fails.
Several models (``--model A --model B``): each gets its own replicas, started from its own
single-model config (``ServeConfig.per_model``), and one gateway routes by ``model``
(gateway/catalog.py).
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bouquet.config import ServeConfig
from bouquet.parent import PARENT_PID_ENV

if TYPE_CHECKING:
    from bouquet.modelspec import ModelSpec

# Environment variables that can hold the API key (the CLI's, the gateway workers' config).
SECRET_ENV = frozenset({"BOUQUET_API_KEY", "BOUQUET_GATEWAY_CONFIG"})

log = logging.getLogger("bouquet")


@dataclass
class ReplicaProcess:
    proc: subprocess.Popen[bytes]
    address: str  # gRPC host:port
    device: str
    ipc_path: str = ""  # Unix socket for this host's gateway workers ("" = gRPC only)
    port_file: Path | None = None  # in a work folder (with the Unix socket) that stop_replicas removes

    def error(self) -> str:
        """The replica's one-line reason for exiting, when it wrote one (server/main.py)."""
        f = self.port_file.with_name(self.port_file.name + ".error") if self.port_file else None
        return f.read_text().strip() if f is not None and f.exists() else ""


def replica_devices(cfg: ServeConfig) -> list[str]:
    """One device string per replica process: ``--replicas-per-gpu`` on each of ``--gpus``, else
    ``--replicas`` × ``--replicas-per-gpu`` on ``--device`` (0 per GPU, not resolved yet: 1)."""
    per_gpu = max(1, cfg.replicas_per_gpu)
    if cfg.gpus:
        return [f"cuda:{g}" for g in cfg.gpus for _ in range(per_gpu)]
    return [cfg.device] * (cfg.replicas * per_gpu)


def replica_gpu(device: str) -> str:
    """The GPU a local replica started on ``device`` runs on ("cuda:0"), "" for a CPU replica.
    ``cuda`` and ``auto`` (on a host with a GPU) are the replica's current device, cuda:0."""
    from bouquet.layout import visible_gpus

    if device.startswith("cuda:"):
        return device
    if device == "cuda" or (device == "auto" and visible_gpus() > 0):
        return "cuda:0"
    return ""


def resolve_layout(cfg: ServeConfig, specs: "list[ModelSpec]") -> ServeConfig:
    """``cfg`` with gateway workers, replicas per GPU and tokenizer threads chosen for this machine
    where the flags left them at 0 (bouquet/layout.py), and ``layout`` saying how."""
    from bouquet.layout import choose_layout, machine_facts, model_parameters

    machine = machine_facts(cfg.device, cfg.gpus, remote=bool(cfg.servers))
    params = max((model_parameters(s.path) for s in specs), default=0)
    lay = choose_layout(machine, params, cfg.gateway_workers, cfg.replicas_per_gpu, cfg.tokenizer_threads,
                        models=len(specs))
    return cfg.replace(gateway_workers=lay.gateway_workers, replicas_per_gpu=lay.replicas_per_gpu,
                       tokenizer_threads=lay.tokenizer_threads, layout=lay.reason,
                       batch_one_replica_per_gpu=lay.batch_one_replica_per_gpu)


def spawn_replicas(cfg: ServeConfig, host_replicas: int = 0) -> list[ReplicaProcess]:
    """Spawn one server process per replica of ``cfg``'s model and return at once (``address``
    empty until ``await_bound``). ``host_replicas``: replica processes of every model on this host
    (0 = this model's), among which CPU replicas share the cores. Several models spawn all their
    replicas before waiting for any, so their start-ups (a replica's imports take seconds) overlap."""
    devices = replica_devices(cfg)
    tmp = Path(tempfile.mkdtemp(prefix="bouquet-"))
    out: list[ReplicaProcess] = []
    sharing = host_replicas or len(devices)
    cpu_threads = max(1, (os.cpu_count() or 1) // sharing)
    for i, dev in enumerate(devices):
        port_file = tmp / f"replica{i}.port"
        # The API key is never on a replica's command line (readable by any local user in
        # /proc/PID/cmdline) nor in its environment (inherited by whatever it starts): it goes
        # through a pipe on stdin, which the replica reads once (server/main.py --api-key-stdin)
        # and then requires on its gRPC port (proto/rpc.py ApiKeyInterceptor).
        env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
        env[PARENT_PID_ENV] = str(os.getpid())  # the replica exits when this process is gone (parent.py)
        if not dev.startswith("cuda") and sharing > 1:
            env.setdefault("OMP_NUM_THREADS", str(cpu_threads))
        rcfg = cfg.replace(grpc_port=cfg.grpc_port + i if cfg.grpc_port else 0, api_key=None)
        cmd = [sys.executable, "-m", "bouquet.server", "--config", rcfg.to_json(), "--port-file", str(port_file), "--device", dev]
        ipc = str(tmp / f"replica{i}.sock") if cfg.transport == "auto" else ""
        if ipc:
            cmd += ["--ipc-path", ipc]
        if cfg.api_key:
            cmd.append("--api-key-stdin")
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE if cfg.api_key else None)
        if cfg.api_key:
            _send_key(proc, cfg.api_key)
        out.append(ReplicaProcess(proc, "", dev, ipc, port_file))
    return out


def _send_key(proc: subprocess.Popen[bytes], api_key: str) -> None:
    """Write the key as one line into the replica's stdin pipe and close it (far below a pipe's
    buffer: never blocks). A replica that already exited is reported by ``await_bound``."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(api_key.encode() + b"\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass


def await_bound(spawned: list[ReplicaProcess], startup_timeout_s: float = 120.0) -> list[ReplicaProcess]:
    """Wait until each spawned replica has bound its gRPC port; returns them with their addresses.

    Raises RuntimeError (after stopping them all) when a replica exits before binding, with the
    replica's own one-line reason when it wrote one (server/main.py: ``PORT_FILE.error``).
    """
    out: list[ReplicaProcess] = []
    deadline = time.monotonic() + startup_timeout_s
    try:
        for r in spawned:
            assert r.port_file is not None
            while not r.port_file.exists():
                if r.proc.poll() is not None or time.monotonic() > deadline:
                    reason = r.error()
                    if reason:
                        raise RuntimeError(f"server replica on {r.device}: {reason}")
                    what = (f"exited (code {r.proc.returncode})" if r.proc.returncode is not None
                            else f"did not bind within {startup_timeout_s:.0f} s")
                    raise RuntimeError(f"server replica on {r.device} {what} before binding its port")
                time.sleep(0.02)
            out.append(ReplicaProcess(r.proc, f"127.0.0.1:{r.port_file.read_text().strip()}", r.device, r.ipc_path,
                                      r.port_file))
    except BaseException:  # a replica failed, or a signal (serve: SystemExit) came while waiting
        stop_replicas(spawned)
        raise
    return out


def stop_replicas(replicas: list[ReplicaProcess], timeout_s: float = 20.0) -> None:
    """SIGTERM (the replica drains), then SIGKILL whatever is still alive after ``timeout_s``; then
    remove the replicas' work folders (port files, Unix sockets)."""
    for r in replicas:
        if r.proc.poll() is None:
            r.proc.terminate()
    deadline = time.monotonic() + timeout_s
    for r in replicas:
        try:
            r.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            r.proc.kill()
            r.proc.wait()
    for workdir in {r.port_file.parent for r in replicas if r.port_file is not None}:
        shutil.rmtree(workdir, ignore_errors=True)


def bind_gateway_socket(host: str, port: int) -> socket.socket:
    """The gateway's listening socket, bound before any replica starts so that a port in use fails
    the command at once (not after the model has loaded), and listening from then on: a client
    that connects while the gateway starts waits in the backlog instead of being refused. Same
    options as uvicorn's own bind (SO_REUSEADDR, inheritable for ``--gateway-workers``).
    Raises OSError naming the address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        # A port in use (or below 1024 without the right) is the port's fault; a name that does not
        # resolve or an address of no interface here (EADDRNOTAVAIL, gaierror) is the host's.
        port_fault = e.errno in (errno.EADDRINUSE, errno.EACCES)
        hint = "choose another --port" if port_fault else "check --host: an address of this machine, or 0.0.0.0 for all"
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror} ({hint})") from None
    sock.listen(2048)  # uvicorn's default backlog
    sock.set_inheritable(True)
    return sock


def localize_model(cfg: ServeConfig) -> ServeConfig:
    """Fetch a Hugging Face model here, once, before any replica starts (bouquet/hub.py: progress on
    stderr). The config passed down then names its local snapshot directory as ``model`` (replicas
    and gateway workers never download) and the id as the public name. A directory or the embedded
    model is returned as is. Raises HubError/ModelError (one line naming the model), also when a
    replica started here would find only pickled weights and ``--allow-pickle`` is off."""
    from bouquet.hub import HubError, split_revision, weight_files
    from bouquet.modelspec import require_model_files, resolve_model_path

    # Replicas started here load weights; a gateway for remote replicas or the no-op engine does not.
    weights = cfg.engine == "torch" and not cfg.servers
    path = resolve_model_path(cfg.model, cfg.revision, download=True, allow_pickle=cfg.allow_pickle, weights=weights)
    require_model_files(path)  # a folder that is no model says so, not that it lacks safetensors
    if weights:
        try:
            weight_files(path, cfg.allow_pickle)  # refuse now rather than in every replica
        except HubError as e:
            raise HubError(f"model {cfg.model!r}: {e}") from None
    if cfg.model is None or Path(cfg.model).expanduser().is_dir():
        return cfg
    repo_id = split_revision(cfg.model)[0]
    names = cfg.served_model_name or tuple(dict.fromkeys((repo_id, cfg.model)))  # "ORG/NAME@REV" is accepted too
    return cfg.replace(model=str(path), revision=None, served_model_name=names)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def serve(cfg: ServeConfig) -> int:
    """Run until SIGINT/SIGTERM. Returns the process exit code."""
    from bouquet.families import UNKNOWN, family, unsupported
    from bouquet.gateway.catalog import model_names
    from bouquet.gateway.limits import GatewayConfig, HttpLimits, fit_connections
    from bouquet.layout import HOST_BOUND_BULK_PARAMS, model_parameters
    from bouquet.modelspec import load_spec
    from bouquet.tokenized import read_tokenizer

    entries = [localize_model(c) for c in cfg.per_model()]
    specs = [load_spec(c.model, c.served_model_name[0] if c.served_model_name else None) for c in entries]
    cfg = resolve_layout(cfg, specs)
    log.info("layout: %s", cfg.layout)
    # per_model again: a fixed --grpc-port numbers each model's replicas after the previous model's.
    # The layout is sized by the largest model; batch work on one replica per GPU is each model's own
    # (a small model's bulk steps are host-bound beside a large one too).
    entries = [c.replace(model=e.model, revision=e.revision, served_model_name=e.served_model_name,
                         batch_one_replica_per_gpu=c.batch_one_replica_per_gpu
                         and model_parameters(s.path) > HOST_BOUND_BULK_PARAMS)
               for c, e, s in zip(cfg.per_model(), entries, specs)]
    model_names(list(zip(entries, specs)))  # two models with one name: fail before starting anything
    for c, spec in zip(entries, specs):
        # modelspec reads an architecture it has no row for as a BERT-style encoder, so that a gateway
        # (and the no-op engine) can still describe it; the model's replicas would only refuse it
        if c.engine == "torch" and not c.servers and family(spec.architecture) is UNKNOWN:
            raise RuntimeError(unsupported(spec.architecture))
    # Until uvicorn takes over the signals, SIGTERM unwinds start-up like Ctrl-C does (the replicas
    # started so far are stopped, the work folder removed) instead of killing this process outright.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sock = bind_gateway_socket(cfg.host, cfg.port)
    groups: list[list[ReplicaProcess]] = []  # each model's replica processes
    group_models: list[str] = []  # which model each group serves (named in errors when several are served)
    gcfgs: list[ServeConfig] = []  # each model's config, its replicas' addresses filled in
    spawned: list[list[ReplicaProcess]] = []  # each local model's replicas, spawned before any is awaited
    try:
        for c in entries:
            if not c.servers:
                spawned.append(spawn_replicas(c, host_replicas=len(replica_devices(c)) * len(entries)))
        # Read each tokenizer.json here, while the replicas load: the gateway (each --gateway-workers
        # process) reads it only after they are up, and uvicorn restarts a worker that fails to
        # start, with a traceback each time, for as long as the launcher runs.
        for spec in specs:
            read_tokenizer(spec)
        pending = iter(spawned)
        for c, spec in zip(entries, specs):
            if c.servers:
                addresses, paths, gpus = list(c.servers), [""] * len(c.servers), [""] * len(c.servers)
            else:
                try:
                    groups.append(await_bound(next(pending)))
                except RuntimeError as e:
                    raise RuntimeError(f"{e} (model {c.model})" if len(entries) > 1 else str(e)) from None
                group_models.append(c.model or spec.model_id)  # None: the embedded default, named by its id
                addresses, paths = [r.address for r in groups[-1]], [r.ipc_path for r in groups[-1]]
                gpus = [replica_gpu(r.device) for r in groups[-1]]
            if spec.pools_own_last_token:
                log.warning("model %s: a causal embedder pooled on the last token, with no <|endoftext|> in "
                            "tokenizer.json and no eos_token_id in config.json: nothing is appended, so each text's "
                            "own last token is pooled (a model trained on an end-of-text token gives other vectors)",
                            spec.model_id)
            log.info("model %s (%s, task %s%s, max input %d tokens from %s), replicas %s (%s)", spec.model_id,
                     spec.architecture, spec.task, f": {spec.task_reason}" if spec.task_reason else "",
                     spec.max_seq_length, spec.max_length_source, addresses,
                     "Unix-socket IPC" if any(paths) else "gRPC")
            gcfgs.append(c.replace(servers=tuple(addresses), ipc_paths=tuple(paths), replica_gpus=tuple(gpus),
                                   own_replicas=not c.servers))
    except BaseException:
        stop_replicas([r for g in spawned for r in g])  # bound or not: await_bound's copies share the processes
        sock.close()
        raise
    replicas = [r for g in groups for r in g]
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    # No X-Forwarded-* rewriting (client addresses are never used) and no `server` header: less
    # work per request in uvicorn. Keep-alive: see ServeConfig (above the clients' idle expiry).
    common = dict(host=cfg.host, port=cfg.port, loop=loop, http="bouquet.gateway.protocol:HttpProtocol", log_level=cfg.log_level, access_log=False,
                  proxy_headers=False, server_header=False, timeout_keep_alive=cfg.timeout_keep_alive)
    # The front end's own limits (gateway/limits.py); the open-file limit is raised first so that
    # the connection cap answers 503 before accept() runs out of descriptors.
    limits = HttpLimits.from_config(cfg, fit_connections(cfg.max_connections))
    metrics_dir: str | None = None
    if cfg.gateway_workers > 1:
        from bouquet.gateway.drain import DrainingSupervisor
        from bouquet.gateway.factory import GATEWAY_CONFIG_ENV, configs_to_json
        from bouquet.gateway.metrics import BOUQUET_METRICS_ENV, MULTIPROC_ENV

        # Spawned workers inherit the environment: the factory reads the configs from it. At
        # SIGTERM the supervisor signals each worker, which drains as the single-process gateway
        # does (503 to new requests, up to 30 s for those in flight; factory.py, drain.py).
        os.environ[GATEWAY_CONFIG_ENV] = configs_to_json(gcfgs)
        os.environ[PARENT_PID_ENV] = str(os.getpid())  # workers die with this process (factory.py)
        # The workers are the parallelism: a Rust thread pool of one thread per core in each of
        # them would oversubscribe the cores (an explicit setting wins).
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        # one folder for the workers' Prometheus values, so /metrics sums them (gateway/metrics.py)
        metrics_dir = tempfile.mkdtemp(prefix="bouquet-metrics-")
        os.environ[MULTIPROC_ENV] = os.environ[BOUQUET_METRICS_ENV] = metrics_dir
        ucfg = GatewayConfig("bouquet.gateway.factory:app_from_env", limits, factory=True, workers=cfg.gateway_workers,
                             timeout_graceful_shutdown=5, **common)
        supervisor = DrainingSupervisor(ucfg, sockets=[sock])
        run, stop, stopping = supervisor.run, supervisor.should_exit.set, supervisor.stopping
        worker_failed = supervisor.startup_failed
    else:
        from bouquet.gateway.app import create_app
        from bouquet.gateway.drain import DrainingServer, DrainState

        drain = DrainState(timeout_s=cfg.drain_timeout)  # SIGTERM: finish requests in flight, answer new ones 503
        app = create_app(list(zip(gcfgs, specs)), drain)
        server = DrainingServer(GatewayConfig(app, limits, timeout_graceful_shutdown=5, **common), drain)
        run, stop = (lambda: server.run(sockets=[sock])), lambda: setattr(server, "should_exit", True)
        stopping = lambda: drain.draining  # noqa: E731 - the other branch's is a bound method
        worker_failed = lambda: False  # noqa: E731 - here the app is built above, in this process
    failed, finished = threading.Event(), threading.Event()
    reasons: list[str] = []

    def watch() -> None:
        while not finished.wait(0.5):
            i = next((i for i, g in enumerate(groups) if g and all(r.proc.poll() is not None for r in g)), None)
            if i is not None and stopping():
                # SIGTERM to the whole process group (systemd's default KillMode, `timeout`) reached the
                # replicas too: they drained and exited while the gateway drains, which is no failure
                return
            if i is not None:
                which = f" (model {group_models[i]})" if len(entries) > 1 else ""
                reasons.extend(dict.fromkeys(e + which for e in (r.error() for r in groups[i]) if e))
                if not reasons:  # with reasons, the command's error line says it all
                    log.error("every server replica of model %s has exited; stopping the gateway",
                              group_models[i])
                failed.set()
                stop()
                return

    threading.Thread(target=watch, daemon=True).start()
    port = sock.getsockname()[1]  # the bound one, also for --port 0
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    log.info("gateway on http://%s:%d (OpenAI: /v1/embeddings), %d worker(s)", host, port, cfg.gateway_workers)
    try:
        run()
    finally:
        finished.set()
        stop_replicas(replicas)
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    if reasons:  # e.g. a model that --quantization fp8 refuses, found after the port was bound
        raise RuntimeError("server replica: " + "; ".join(reasons))
    if worker_failed():
        raise RuntimeError("a gateway worker could not start (its error is logged above); the server stopped")
    return 1 if failed.is_set() else 0


def serve_replica(cfg: ServeConfig, device: str | None = None) -> int:
    """`bouquet server`: one standalone replica on ``cfg.host:cfg.grpc_port`` (in this process)."""
    from bouquet.server.main import run_async, serve as run_server

    run_async(run_server(localize_model(cfg), None, device, cfg.host))
    return 0
