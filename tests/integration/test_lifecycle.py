"""`bouquet serve` process lifecycle: no orphan server processes after SIGTERM or SIGKILL, no work
folders left behind, and start-up failures that end the command with one clear line."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bouquet.modelspec import resolve_model_path
from helpers import REPO, BouquetProcess, GrpcServer, free_port


def children(pid: int) -> list[int]:
    p = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in p.read_text().split()] if p.exists() else []


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.split(")")[-1].split()[0] != "Z"


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig,workers", [(signal.SIGTERM, 1), (signal.SIGKILL, 1), (signal.SIGKILL, 2)])
def test_no_orphans(sig, workers, tmp_path):
    # Replicas and gateway workers die with the launcher, even one killed with SIGKILL.
    srv = BouquetProcess("--gateway-workers", str(workers), env={"TMPDIR": str(tmp_path)})
    try:
        kids = children(srv.proc.pid)
        assert kids, "the launcher should have started a server process"
        assert srv.embed("before stop").status_code == 200
        os.kill(srv.proc.pid, sig)
        srv.proc.wait(30)
        assert wait_gone(kids, 30) == []
    finally:
        srv.stop()
    assert list(tmp_path.glob("bouquet-*/")) == []  # no work folder left, even by a killed launcher


def serve_fails(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, str]:
    """Run `bouquet serve` expecting it to stop by itself: (exit code, stdout + stderr)."""
    cmd = [sys.executable, "-m", "bouquet", "serve", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})})
    return out.returncode, out.stdout + out.stderr


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


@pytest.mark.parametrize("sig,workers", [(signal.SIGINT, 1), (signal.SIGINT, 2), (signal.SIGTERM, 1), (signal.SIGTERM, 2)])
def test_ctrl_c_stops_cleanly(tmp_path, sig, workers):
    # Ctrl-C in a terminal signals the whole process group (launcher, gateway workers, replicas):
    # the gateway drains while the replicas keep serving, nothing warns, no work folder is left.
    # SIGTERM to the whole group (systemd's default KillMode, `timeout`) reaches the replicas too, which
    # drain and exit on their own: the gateway, draining itself, warned "replica ...: connection lost".
    srv = BouquetProcess("--gateway-workers", str(workers), env={"TMPDIR": str(tmp_path)}, new_session=True)
    try:
        folders = [f for f in tmp_path.glob("bouquet-*/") if not f.name.startswith("bouquet-metrics-")]
        assert len(folders) == 1 and (folders[0] / "replica0.port").exists()
        # with gateway workers, also the folder of their shared Prometheus values (gateway/metrics.py)
        assert len(list(tmp_path.glob("bouquet-metrics-*/"))) == (workers > 1)
        assert srv.embed("hello").status_code == 200
        os.killpg(srv.proc.pid, sig)
        assert srv.proc.wait(60) == 0
    finally:
        srv.stop()
    assert list(tmp_path.glob("bouquet-*/")) == []
    log = srv.log_path.read_text()
    assert "WARNING" not in log and "Traceback" not in log, log[-3000:]


def test_sigterm_to_the_group_while_gateway_workers_start_is_quiet(tmp_path):
    # The group's SIGTERM stops the replica while a gateway worker is still in its start-up: the
    # worker's first probe then finds the replica gone, which was logged as a fault ("not usable",
    # WARNING) when the worker took the signal only after those probes.
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "bouquet", "serve", "--port", str(free_port()), "--device", "cpu",
                                 "--gateway-workers", "2"], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True, env={**os.environ, "TMPDIR": str(tmp_path)})
        try:
            deadline = time.monotonic() + 120
            while "gateway on http" not in log_path.read_text() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)  # the workers are starting (warned at offsets 0-0.7 s before the fix)
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    text = log_path.read_text()
    assert "gateway on http" in text and "WARNING" not in text and "Traceback" not in text, text[-3000:]


def test_port_in_use_fails_before_loading(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        t0 = time.monotonic()
        code, out = serve_fails("--port", str(port), "--device", "cpu", env={"TMPDIR": str(tmp_path)})
    assert code == 1, out
    assert last_line(out) == f"error: cannot listen on 127.0.0.1:{port}: Address already in use (choose another --port)"
    assert "loading" not in out and "Traceback" not in out, out  # no replica was started
    assert time.monotonic() - t0 < 30
    assert list(tmp_path.glob("bouquet-*/")) == []


@pytest.mark.parametrize("damage", ["config", "weights"])
def test_replica_startup_error_is_one_line(tmp_path, damage):
    # A replica refusing the model ends the command with its reason as the only error line, without
    # a traceback: a config that does not match the checkpoint, or a truncated checkpoint (both
    # found after the gRPC port is bound, while the gateway is up).
    model = tmp_path / "model"
    shutil.copytree(resolve_model_path(None), model)
    if damage == "config":
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "hidden_size": 256}))
        expected = "checkpoint shape (384,)"
    else:
        weights = model / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100_000])
        expected = "not a readable safetensors file"
    code, out = serve_fails("--model", str(model), "--port", str(free_port()), "--device", "cpu",
                            env={"TMPDIR": str(tmp_path)})
    assert code == 1, out
    assert last_line(out).startswith("error: server replica: ") and expected in last_line(out), out
    assert "Traceback" not in out and "ERROR" not in out, out
    assert list(tmp_path.glob("bouquet-*/")) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_gpu_is_one_line(tmp_path):
    code, out = serve_fails("--port", str(free_port()), "--device", "cuda", env={"TMPDIR": str(tmp_path)})
    assert code == 1, out
    assert last_line(out) == ("error: server replica on cuda: cuda was requested (--device cuda or --gpus) but torch sees "
                              "no CUDA device; use --device cpu (or auto) on a machine without a GPU"), out
    assert "Traceback" not in out, out
    assert list(tmp_path.glob("bouquet-*/")) == []


def test_bad_environment_value_is_a_usage_error(tmp_path):
    # BOUQUET_PORT / _HOST / _DEVICE / _MODEL are read when a command parses its options (click's
    # envvar), not at import: a bad value fails that command with the option's name and exit code 2,
    # and other commands (--help, --version) are untouched.
    env = {"BOUQUET_PORT": "abc", "TMPDIR": str(tmp_path)}
    code, out = serve_fails(env=env)
    assert code == 2 and "Traceback" not in out, out
    assert "Invalid value for '--port' (env var: 'BOUQUET_PORT')" in out, out
    # -h is --help everywhere (issue 39: `bouquet embed -h` was "No such option")
    for args in (["--version"], ["serve", "--help"], ["embed", "--help"], ["-h"], ["embed", "-h"], ["serve", "-h"],
                 ["server", "-h"], ["bench", "-h"]):
        done = subprocess.run([sys.executable, "-m", "bouquet", *args], capture_output=True, text=True, timeout=60,
                              cwd=REPO, env={**os.environ, **env})
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert "Usage: bouquet" in done.stdout or args == ["--version"], (args, done.stdout[:300])
    shown = subprocess.run([sys.executable, "-m", "bouquet", "serve", "--help"], capture_output=True, text=True,
                           timeout=60, cwd=REPO).stdout
    for name in ("BOUQUET_HOST", "BOUQUET_PORT", "BOUQUET_DEVICE", "BOUQUET_MODEL", "BOUQUET_API_KEY"):
        assert name in " ".join(shown.split()), name


def model_copy(tmp_path: Path, config: object | None = None) -> Path:
    """The embedded model's files in a folder of ``tmp_path`` (the weights linked), config.json
    replaced by ``config`` when given."""
    model = tmp_path / "model"
    model.mkdir()
    for f in resolve_model_path(None).iterdir():
        (model / f.name).symlink_to(f)
    if config is not None:
        (model / "config.json").unlink()
        (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.mark.parametrize("mistake", ["folder_not_a_model", "relative_path_typo", "host_not_here",
                                     "architecture_not_supported", "architecture_with_a_width", "config_not_an_object"])
def test_start_up_mistakes_name_their_cause(tmp_path, mistake):
    # What a new user mistypes ends `serve` at once, before any replica loads, with one line naming
    # the real cause: a folder without config.json is no model (it used to be told "no safetensors
    # weights ... --allow-pickle"), a path that does not exist is not a local directory (it used to read
    # as a Hub lookup only), and an address of no interface here is --host's fault (it used to say
    # "choose another --port"). 192.0.2.1 is TEST-NET-1 (RFC 5737): never a local address. A model of
    # an architecture bouquet does not serve whose config names no hidden_size (GPT-2's is n_embd) said
    # "error: 'dim'", and a config.json holding a list "'list' object has no attribute 'get'". One whose
    # config does name a hidden_size started a replica, which refused it, after the gateway had warned
    # "replica ... not usable: ... failed to connect".
    folder = tmp_path / "not-a-model"
    folder.mkdir()
    (folder / "notes.txt").write_text("no model here")
    if mistake == "architecture_not_supported":
        model_copy(tmp_path, {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768})
    elif mistake == "architecture_with_a_width":
        model_copy(tmp_path, {"architectures": ["FooModel"], "model_type": "foo", "hidden_size": 384,
                              "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 30522})
    elif mistake == "config_not_an_object":
        model_copy(tmp_path, [1])
    args, expected = {
        "folder_not_a_model": (["--model", str(folder)], f"error: {folder.resolve()} has no config.json: not a Hugging "
                               "Face model folder (config.json, tokenizer.json, model.safetensors)"),
        "relative_path_typo": (["--model", "models/no-such-model"], "error: model 'models/no-such-model' is not a local "
                               "directory, nor (completely) in the local Hugging Face cache"),
        "host_not_here": (["--host", "192.0.2.1"], "error: cannot listen on 192.0.2.1:"),
        "architecture_not_supported": (["--model", str(tmp_path / "model")], "error: architecture 'GPT2LMHeadModel' is "
                                       "not supported; supported: ['BertForMaskedLM', "),
        "architecture_with_a_width": (["--model", str(tmp_path / "model")], "error: architecture 'FooModel' is not "
                                      "supported; supported: ['BertForMaskedLM', "),
        "config_not_an_object": (["--model", str(tmp_path / "model")], f"error: {tmp_path / 'model' / 'config.json'} "
                                 "must hold a JSON object, got list [1]"),
    }[mistake]
    port = free_port()
    env = {"TMPDIR": str(tmp_path), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    t0 = time.monotonic()
    code, out = serve_fails(*args, "--port", str(port), "--device", "cpu", env=env)
    assert code == 1, out
    assert last_line(out).startswith(expected), out
    if mistake == "host_not_here":
        assert last_line(out).endswith("(check --host: an address of this machine, or 0.0.0.0 for all)"), out
    assert "loading" not in out and "Traceback" not in out, out  # no replica was started
    assert time.monotonic() - t0 < 30
    assert list(tmp_path.glob("bouquet-*/")) == []


def test_a_model_its_replica_refuses_ends_serve_with_one_line(tmp_path):
    """A model the replica refuses while loading (a scaled rope, found only when the layers are
    built): `serve` ends with the replica's reason as its last line, and the gateway, whose probe
    found the replica gone, says so at INFO, not as a WARNING before the error (a decoder trial saw
    "replica ... not usable: UNAVAILABLE" ahead of every such refusal)."""
    from tests.fixtures.tiny_models import make_tiny_model

    model = tmp_path / "scaled"
    shutil.copytree(make_tiny_model("qwen3", tmp_path / "src"), model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    (model / "config.json").write_text(json.dumps(cfg))
    code, out = serve_fails("--model", str(model), "--port", str(free_port()), "--device", "cpu",
                            env={"TMPDIR": str(tmp_path)})
    assert code == 1, out
    assert last_line(out) == "error: server replica: rope_type 'yarn' is not supported; only 'default' rotary embeddings are", out
    assert "WARNING" not in out and "Traceback" not in out, out


@pytest.mark.parametrize("workers", [1, 2])
def test_unreadable_tokenizer_is_one_line(tmp_path, workers):
    # The gateway reads tokenizer.json only once the replicas are up. A file `tokenizers` cannot read
    # printed the error in the middle of the replica's start-up lines (the replica went on loading
    # after the launcher had exited); with gateway workers, uvicorn restarted each worker that failed
    # to start, a traceback each time, until killed. Now the launcher reads the file while the
    # replicas load and stops them: one line, the last.
    model = model_copy(tmp_path)
    (model / "tokenizer.json").unlink()
    (model / "tokenizer.json").write_text("{}")
    t0 = time.monotonic()
    code, out = serve_fails("--model", str(model), "--port", str(free_port()), "--device", "cpu",
                            "--gateway-workers", str(workers), env={"TMPDIR": str(tmp_path)}, timeout=60)
    assert code == 1, out
    assert last_line(out) == f"error: {model / 'tokenizer.json'} cannot be read by tokenizers: Model missing. at line 1 column 2", out
    assert "Traceback" not in out and "ready" not in out, out
    assert time.monotonic() - t0 < 30
    assert list(tmp_path.glob("bouquet-*/")) == []


def test_gateway_worker_that_cannot_build_its_app_stops_the_server(tmp_path):
    # A dependency that fails to import only in the gateway workers (seen: fastapi 0.165 without
    # opentelemetry-api, which it imports; the launcher never imports fastapi with --gateway-workers)
    # made every worker exit with code 1, which uvicorn's supervisor answers with a new worker: the
    # server printed a traceback per respawn, never answered /health and never exited. Now the first
    # failure stops it with one line, the last.
    broken = tmp_path / "site" / "fastapi"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'opentelemetry\'")\n')
    pythonpath = os.pathsep.join(p for p in (str(broken.parent), os.environ.get("PYTHONPATH", "")) if p)
    t0 = time.monotonic()
    code, out = serve_fails("--port", str(free_port()), "--device", "cpu", "--gateway-workers", "2",
                            env={"TMPDIR": str(tmp_path), "PYTHONPATH": pythonpath}, timeout=60)
    assert code == 1, out
    assert last_line(out) == "error: a gateway worker could not start (its error is logged above); the server stopped", out
    assert "ModuleNotFoundError: No module named 'opentelemetry'" in out, out
    assert out.count("the app could not be built") <= 2, out  # the two workers once each: none restarted
    assert time.monotonic() - t0 < 30
    assert list(tmp_path.glob("bouquet-*/")) == []


def test_grpc_port_held_by_another_replica_is_refused(tmp_path):
    # gRPC sets SO_REUSEPORT by default: a second `bouquet server` (or `serve --grpc-port`) on a port a
    # running replica holds used to bind it too, report ready and have the kernel split the gateways'
    # connections between the two. Now it stops at once with one line naming the address.
    held = GrpcServer()
    try:
        port = held.address.rsplit(":", 1)[1]
        env = {**os.environ, "TMPDIR": str(tmp_path)}
        done = subprocess.run([sys.executable, "-m", "bouquet", "server", "--device", "cpu", "--port", port],
                              capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
        assert done.returncode == 1, done.stderr[-3000:]
        assert last_line(done.stderr) == (f"error: gRPC cannot listen on 127.0.0.1:{port}: the port is in use, or the "
                                          "host is not an address of this machine"), done.stderr[-3000:]
        code, out = serve_fails("--grpc-port", port, "--port", str(free_port()), "--device", "cpu",
                                env={"TMPDIR": str(tmp_path)})
        assert code == 1 and last_line(out).startswith("error: server replica on cpu: gRPC cannot listen on "), out
        assert "Traceback" not in done.stderr + out
    finally:
        held.stop()
    assert list(tmp_path.glob("bouquet-*/")) == []
