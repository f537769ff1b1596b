"""`--model ORG/NAME[@REVISION]` from a Hub: the real huggingface_hub client downloads a tiny model
from a local HTTP server laid out like the Hub (HF_ENDPOINT), into an HF_HOME under tmp_path.

The server answers what ``snapshot_download`` asks (huggingface_hub 2.x; 0.2x reads ``siblings``):
``GET /api/models/{repo}/revision/{rev}`` (JSON with ``sha`` and ``siblings``), ``GET
/api/models/{repo}/tree/{commit}`` (the file listing) and ``HEAD``/``GET /{repo}/resolve/{commit}/{file}``
(headers X-Repo-Commit, ETag, Content-Length); misses carry X-Error-Code as the Hub's do. Every
request is recorded, so the test can say which files were never fetched.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx
import numpy as np
import pytest

from tests.fixtures.tiny_models import make_tiny_model
from tests.helpers import REPO, BouquetProcess, free_port

TEXTS = ["the river runs past the city", "a", "search query for a relevant passage about music and light"]
# Files a Hub repository often holds next to the model that bouquet must never fetch.
UNNEEDED = {"onnx/model.onnx": b"\0" * 4096, "pytorch_model.bin": b"not a checkpoint", "README.md": b"# tiny\n",
            "openvino/openvino_model.xml": b"<xml/>"}


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


class FakeHub:
    """repos: id → {revision name → commit}; commits: commit → {path → bytes}."""

    def __init__(self) -> None:
        self.refs: dict[str, dict[str, str]] = {}
        self.commits: dict[str, dict[str, bytes]] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

            def do_GET(self) -> None:
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, repo: str, revision: str, files: dict[str, bytes]) -> str:
        commit = _sha(f"{repo}@{revision}")
        self.refs.setdefault(repo, {})[revision] = commit
        self.commits[commit] = files
        return commit

    def stop(self) -> None:
        if self.server.fileno() != -1:
            self.server.shutdown()
            self.server.server_close()

    def _commit(self, repo: str, rev: str) -> str | None:
        refs = self.refs.get(repo, {})
        return refs.get(rev) or (rev if rev in refs.values() else None)

    def answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.requests.append((h.command, path))
        api = path.startswith("/api/models/")
        parts = (path[len("/api/models/"):] if api else path[1:]).split("/")
        repo = "/".join(parts[:2])
        if repo not in self.refs:
            return self._send(h, 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}, body)
        kind, rest = parts[2], parts[3:]
        if api and kind == "revision":
            commit = self._commit(repo, "/".join(rest))
            if commit is None:
                return self._send(h, 404, b'{"error": "Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"}, body)
            info = {"id": repo, "modelId": repo, "sha": commit, "private": False, "tags": [],
                    "siblings": [{"rfilename": f} for f in sorted(self.commits[commit])]}
            return self._send(h, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
        if api and kind == "tree":
            commit = self._commit(repo, rest[0])
            if commit is None:
                return self._send(h, 404, b'{"error": "Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"}, body)
            tree = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for f, b in sorted(self.commits[commit].items())]
            return self._send(h, 200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, body)
        if not api and kind == "resolve":
            commit = self._commit(repo, rest[0])
            if commit is None:
                return self._send(h, 404, b"", {"X-Error-Code": "RevisionNotFound"}, body)
            data = self.commits[commit].get("/".join(rest[1:]))
            if data is None:
                return self._send(h, 404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit}, body)
            etag = f'"{hashlib.sha256(data).hexdigest()}"'
            return self._send(h, 200, data, {"X-Repo-Commit": commit, "ETag": etag,
                                             "Content-Type": "application/octet-stream"}, body)
        self._send(h, 404, b"", {}, body)

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)

    def fetched(self) -> set[str]:
        """Repository files whose content was requested (HEAD or GET on /resolve/)."""
        return {p.split("/resolve/", 1)[1].split("/", 1)[1] for _, p in self.requests if "/resolve/" in p}


def _files(d: Path) -> dict[str, bytes]:
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}


def _st_files(normalize: bool) -> dict[str, bytes]:
    """sentence-transformers files: mean pooling, then Normalize when asked."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    return {"modules.json": json.dumps(modules).encode(),
            "1_Pooling/config.json": json.dumps({"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True}).encode(),
            "sentence_bert_config.json": b'{"max_seq_length": 48, "do_lower_case": false}',
            "config_sentence_transformers.json": b'{"prompts": {}, "default_prompt_name": null}'}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A fake Hub with org/tiny (main: normalized; tag v1: the same weights without Normalize) and
    org/pickled (weights only as pytorch_model.bin); plus the main tree written as a directory."""
    import torch
    from safetensors.torch import load_file

    root = tmp_path_factory.mktemp("hub")
    model = make_tiny_model("bert", root / "bert")
    base = {k: v for k, v in _files(model).items()}
    fake = FakeHub()
    main = {**base, **_st_files(normalize=True), **UNNEEDED}
    fake.add("org/tiny", "main", main)
    fake.add("org/tiny", "v1", {**base, **_st_files(normalize=False), **UNNEEDED})
    state = load_file(str(model / "model.safetensors"))
    buf = root / "pickled.bin"
    torch.save(state, buf)
    pickled = {k: v for k, v in main.items() if k not in ("model.safetensors", "pytorch_model.bin")}
    fake.add("org/pickled", "main", {**pickled, "pytorch_model.bin": buf.read_bytes()})
    direct = root / "direct"
    for name, data in main.items():
        if name not in UNNEEDED:
            (direct / name).parent.mkdir(parents=True, exist_ok=True)
            (direct / name).write_bytes(data)
    fake.direct = direct  # type: ignore[attr-defined]
    fake.env = {"HF_ENDPOINT": fake.url, "HF_HOME": str(root / "hf-home"), "HF_HUB_OFFLINE": "0",  # type: ignore[attr-defined]
                "HF_HUB_DISABLE_TELEMETRY": "1"}
    yield fake
    fake.stop()


def _embed(*args: str, env: dict[str, str]) -> tuple[np.ndarray, list[str]]:
    """Start `bouquet serve` with ``args``, embed TEXTS, return (vectors, /v1/models ids), stop."""
    p = BouquetProcess(*args, env=env)
    try:
        r = httpx.post(p.url + "/v1/embeddings", json={"input": TEXTS}, timeout=60)
        assert r.status_code == 200, r.text
        ids = [m["id"] for m in httpx.get(p.url + "/v1/models", timeout=10).json()["data"]]
        return np.array([d["embedding"] for d in r.json()["data"]]), ids
    finally:
        p.stop()


def _fail(*args: str, env: dict[str, str]) -> str:
    """Run `bouquet serve` expecting a start-up refusal; return its stderr (one clear line)."""
    cmd = [sys.executable, "-m", "bouquet", "serve", "--device", "cpu", "--port", str(free_port()), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO, env=_environ(env))
    assert p.returncode != 0, p.stdout + p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    return p.stderr


def _environ(extra: dict[str, str]) -> dict[str, str]:
    import os

    return {**os.environ, **extra}


@pytest.fixture(scope="module")
def direct(hub) -> np.ndarray:
    return _embed("--model", str(hub.direct), env={})[0]


def test_download_serves_like_the_directory(hub, direct):
    vecs, ids = _embed("--model", "org/tiny", env=hub.env)
    np.testing.assert_allclose(vecs, direct, atol=1e-6)
    assert ids[0] == "org/tiny"
    fetched = hub.fetched()
    assert {"config.json", "model.safetensors", "tokenizer.json", "modules.json", "1_Pooling/config.json",
            "sentence_bert_config.json"} <= fetched, fetched
    assert not fetched & set(UNNEEDED), fetched
    snapshots = list(Path(hub.env["HF_HOME"]).glob("hub/models--org--tiny/snapshots/*"))
    assert len(snapshots) == 1 and not (snapshots[0] / "onnx").exists()


def test_revision_after_at(hub, direct):
    vecs, ids = _embed("--model", "org/tiny@v1", env=hub.env)
    norms = np.linalg.norm(vecs, axis=1)
    assert not np.allclose(norms, 1.0, atol=1e-3), norms  # v1 has no Normalize module: its own files were served
    np.testing.assert_allclose(vecs / norms[:, None], direct, atol=1e-5)
    assert ids[0] == "org/tiny"


def test_tei_embed_normalizes_by_default_as_tei_does(hub, direct):
    # v1 has no Normalize module: /v1/embeddings follows the model's modules (unnormalized), TEI's
    # /embed defaults `normalize` to true as TEI does, and `normalize: false` gives the raw vectors.
    p = BouquetProcess("--model", "org/tiny@v1", env=hub.env)
    try:
        raw = np.array([d["embedding"] for d in httpx.post(p.url + "/v1/embeddings", json={"input": TEXTS},
                                                           timeout=60).json()["data"]])
        tei = np.array(httpx.post(p.url + "/embed", json={"inputs": TEXTS}, timeout=60).json())
        off = np.array(httpx.post(p.url + "/embed", json={"inputs": TEXTS, "normalize": False}, timeout=60).json())
    finally:
        p.stop()
    np.testing.assert_allclose(np.linalg.norm(tei, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(tei, direct, atol=1e-5)
    np.testing.assert_allclose(off, raw, atol=1e-6)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-3)


def test_unknown_id_or_revision_is_one_clear_line(hub):
    err = _fail("--model", "org/nope", env=hub.env)
    assert "'org/nope'" in err and "not found" in err, err
    err = _fail("--model", "org/tiny", "--revision", "nope", env=hub.env)
    assert "'org/tiny'" in err and "'nope'" in err, err
    err = _fail("--model", "org/tiny@v1", "--revision", "v2", env=hub.env)
    assert "'v1'" in err and "'v2'" in err, err


def test_pickled_weights_need_allow_pickle(hub, direct):
    def pickle_fetched() -> bool:
        return any(p.startswith("/org/pickled/resolve/") and p.endswith("/pytorch_model.bin") for _, p in hub.requests)

    err = _fail("--model", "org/pickled", env=hub.env)
    assert "--allow-pickle" in err, err
    assert not pickle_fetched()  # without --allow-pickle the pickle is not even downloaded
    vecs, _ = _embed("--model", "org/pickled", "--allow-pickle", env=hub.env)
    np.testing.assert_allclose(vecs, direct, atol=1e-6)
    assert pickle_fetched()


def test_no_weights_without_local_replicas(hub, tmp_path):
    """A gateway whose replicas run elsewhere (or the no-op engine) fetches configs and tokenizer only."""
    vecs, ids = _embed("--model", "org/tiny", "--engine", "noop", env={**hub.env, "HF_HOME": str(tmp_path)})
    assert ids[0] == "org/tiny" and vecs.shape == (len(TEXTS), 64)
    (snapshot,) = tmp_path.glob("hub/models--org--tiny/snapshots/*")
    assert (snapshot / "tokenizer.json").exists() and not (snapshot / "model.safetensors").exists()


def test_offline_starts_from_the_cache(hub, direct):
    """Last: stops the fake Hub. HF_HUB_OFFLINE=1 with the server gone starts from the cache."""
    fetch = "from bouquet.hub import fetch_model as f; f('org/tiny', download=True); f('org/tiny@v1', download=True)"
    subprocess.run([sys.executable, "-c", fetch], check=True, cwd=REPO, env=_environ(hub.env), timeout=120)  # run alone too
    hub.stop()
    offline = {**hub.env, "HF_HUB_OFFLINE": "1"}
    vecs, _ = _embed("--model", "org/tiny", env=offline)
    np.testing.assert_allclose(vecs, direct, atol=1e-6)
    vecs, _ = _embed("--model", "org/tiny", "--revision", "v1", env=offline)
    assert not np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-3)
    err = _fail("--model", "org/other", env=offline)
    assert "'org/other'" in err and "HF_HUB_OFFLINE" in err, err
