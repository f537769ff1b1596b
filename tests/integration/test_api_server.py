"""Server-wide behaviour on the real server: --api-key, payload and input limits, the server's
truncation default, sentence-transformers prompts, declared Matryoshka sizes, /metrics, /openapi.json
and JSON 404/405."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import BouquetProcess

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "query: "
ORIGIN = "https://app.example.com"


@pytest.fixture(scope="module")
def custom_dir(tmp_path_factory) -> Path:
    """MiniLM (files linked) with a sentence-transformers prompt and declared Matryoshka sizes."""
    from bouquet.modelspec import resolve_model_path

    src = resolve_model_path(None)
    out = tmp_path_factory.mktemp("custom")
    for p in src.rglob("*"):
        if p.is_file():
            (out / p.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(p, out / p.relative_to(src))
    (out / "config_sentence_transformers.json").unlink()
    (out / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": PROMPT, "document": ""}}))
    cfg = json.loads((src / "config.json").read_text())
    cfg["bouquet"] = {"matryoshka_dimensions": [128, 256]}
    (out / "config.json").unlink()
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def custom_server(custom_dir):
    srv = BouquetProcess("--model", str(custom_dir), "--served-model-name", "custom", "--served-model-name", "custom-2",
                         "--api-key", KEY,
                         "--no-truncate", "--max-inputs", "8", "--max-request-bytes", "4096",
                         "--cors-allow-origin", ORIGIN)
    yield srv
    srv.stop()


def post(srv, path: str, body: dict, headers: dict | None = AUTH) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers=headers, timeout=60)


def vecs(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def test_unknown_model_names_every_served_name(custom_server):
    assert post(custom_server, "/v1/embeddings", {"input": "x", "model": "custom-2"}).status_code == 200
    r = post(custom_server, "/v1/embeddings", {"input": "x", "model": "gpt-4"})
    assert r.status_code == 404 and r.json()["error"]["message"].endswith(
        "this server serves 'custom' (also named 'custom-2')"), r.text


def test_api_key(custom_server):
    assert httpx.get(custom_server.url + "/health").status_code == 200  # open
    for path, shape in (("/v1/embeddings", "openai"), ("/embed", "tei"), ("/v1/rerank", "openai")):
        for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = post(custom_server, path, {"input": "x", "inputs": "x"}, headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", r.text
            assert ("message" in r.json()["error"]) if shape == "openai" else (r.json()["error_type"] == "Unauthorized")
    spec = httpx.get(custom_server.url + "/openapi.json", headers=AUTH).json()
    for path in ("/metrics", "/info", "/v1/models", "/v1/models/custom", "/openapi.json"):
        assert httpx.get(custom_server.url + path).status_code == 401
        assert httpx.get(custom_server.url + path, headers=AUTH).status_code == 200
        if path != "/openapi.json":  # FastAPI's own
            assert "401" in spec["paths"][path.replace("/custom", "/{model}")]["get"]["responses"], path
    # The scheme name is case-insensitive and surrounding whitespace does not matter (RFC 9110 §11.1).
    for value in (f"bearer {KEY}", f"BEARER {KEY}", f"Bearer   {KEY}", f"Bearer\t{KEY}"):
        assert post(custom_server, "/v1/embeddings", {"input": "x"}, {"Authorization": value}).status_code == 200, value
    assert post(custom_server, "/v1/embeddings", {"input": "x"}, {"Authorization": f"Basic {KEY}"}).status_code == 401
    openai = pytest.importorskip("openai")
    ok = openai.OpenAI(base_url=custom_server.url + "/v1", api_key=KEY).embeddings.create(model="custom", input="hi")
    assert len(ok.data[0].embedding) == 384
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=custom_server.url + "/v1", api_key="nope").embeddings.create(model="custom", input="hi")


def test_api_key_stays_out_of_the_replicas(custom_server):
    """The replicas never need the key: it is not on their command line (world-readable in
    /proc/PID/cmdline) nor in their environment, and no log line shows it."""
    from bouquet.bench.procs import tree_pids

    replicas = [p for p in tree_pids(custom_server.proc.pid) if p != custom_server.proc.pid]
    assert replicas, "no replica process found"
    for pid in replicas:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert b"bouquet.server" in cmdline or b"multiprocessing" in cmdline, cmdline[:200]
        assert KEY.encode() not in cmdline, cmdline[:300]
        assert KEY.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
    assert post(custom_server, "/v1/embeddings", {"input": "x"}).status_code == 200
    assert KEY not in custom_server.log()


@pytest.mark.parametrize("how", ["env", "flag"])
def test_empty_api_key_refuses_to_start_and_help_hides_the_key(how):
    """An empty key (an unset secret mounted as ``BOUQUET_API_KEY=``) must not serve without
    authentication; ``serve --help`` must not print the key it reads from the environment."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "BOUQUET_API_KEY": "" if how == "env" else KEY}
    args = ["--api-key", " "] if how == "flag" else []
    r = subprocess.run([sys.executable, "-m", "bouquet", "serve", "--device", "cpu", "--port", "0", *args], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "the API key is empty" in r.stderr.strip().splitlines()[-1], r.stderr[-1000:]
    shown = subprocess.run([sys.executable, "-m", "bouquet", "serve", "--help"], env={**os.environ, "BOUQUET_API_KEY": KEY},
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "--api-key" in shown.stdout and KEY not in shown.stdout + shown.stderr


def test_cors(custom_server, minilm_server):
    pre = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    r = httpx.options(custom_server.url + "/v1/embeddings", headers=pre)  # no API key: preflights carry none
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    r = post(custom_server, "/v1/embeddings", {"input": "x"}, {**AUTH, "Origin": ORIGIN})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    r = post(custom_server, "/v1/embeddings", {"input": "x"}, {"Origin": ORIGIN})  # a 401 is readable too
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ORIGIN
    r = httpx.options(custom_server.url + "/embed", headers={**pre, "Origin": "https://evil.example"})
    assert r.status_code == 400 and r.json()["error_type"] == "Validation"
    assert "access-control-allow-origin" not in r.headers
    # Off by default: no preflight answer, no CORS headers.
    r = httpx.options(minilm_server.url + "/v1/embeddings", headers=pre)
    assert r.status_code == 405 and "access-control-allow-origin" not in r.headers
    assert "access-control-allow-origin" not in minilm_server.embed("x").headers


def test_payload_and_input_limits(custom_server):
    r = post(custom_server, "/v1/embeddings", {"input": "x" * 5000})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large" and "4096" in r.json()["error"]["message"]
    r = post(custom_server, "/embed", {"inputs": "x" * 5000})
    assert r.status_code == 413 and set(r.json()) == {"error", "error_type"}
    r = post(custom_server, "/v1/embeddings", {"input": ["a"] * 9})
    assert r.status_code == 413 and "limit is 8" in r.json()["error"]["message"]
    r = post(custom_server, "/v1/rerank", {"query": "q", "documents": ["a"] * 9})
    assert r.status_code == 413 and "limit is 8" in r.json()["error"]["message"]
    assert post(custom_server, "/v1/embeddings", {"input": ["a"] * 8}).status_code == 200


def test_server_truncation_default_off(custom_server):
    long = "many words here " * 100
    r = post(custom_server, "/v1/embeddings", {"input": long})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert post(custom_server, "/v1/embeddings", {"input": long, "truncate": True}).status_code == 200
    assert post(custom_server, "/v1/embeddings", {"input": long, "long_input": "truncate"}).status_code == 200


def test_prompts_and_declared_dimensions(custom_server, minilm_server):
    text = "how do plants grow"
    with_prompt = vecs(post(custom_server, "/v1/embeddings", {"input": [text], "prompt_name": "query"}))
    np.testing.assert_allclose(with_prompt, minilm_server.vectors([PROMPT + text]), atol=1e-5)
    explicit = vecs(post(custom_server, "/v1/embeddings", {"input": [text], "prompt": "passage: "}))
    np.testing.assert_allclose(explicit, minilm_server.vectors(["passage: " + text]), atol=1e-5)
    tei = post(custom_server, "/embed", {"inputs": text, "prompt_name": "query"}).json()
    np.testing.assert_allclose(tei, with_prompt, atol=1e-5)
    for body in ({"prompt_name": "nope"}, {"prompt_name": "query", "prompt": "x"}, {"dimensions": 200}):
        r = post(custom_server, "/v1/embeddings", {"input": text, **body})
        assert r.status_code == 400, body
    assert "[128, 256]" in post(custom_server, "/v1/embeddings", {"input": text, "dimensions": 200}).json()["error"]["message"]
    v = vecs(post(custom_server, "/v1/embeddings", {"input": text, "dimensions": 128}))
    assert v.shape == (1, 128)


def test_metrics(minilm_server):
    def scrape() -> dict[tuple[str, tuple], float]:
        text = httpx.get(minilm_server.url + "/metrics").text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    before = scrape()
    key = ("bouquet_http_requests_total", (("method", "POST"), ("route", "/v1/embeddings"), ("status", "200")))
    assert minilm_server.embed(["metrics one", "metrics two"]).status_code == 200
    assert minilm_server.embed("").status_code == 400
    httpx.get(minilm_server.url + "/definitely-not-a-route")
    assert httpx.delete(minilm_server.url + "/v1/embeddings").status_code == 405
    import time

    time.sleep(1.3)  # replica numbers arrive with the health loop's next Info poll (about 1 s)
    after = scrape()
    assert after[key] == before.get(key, 0) + 1
    k400 = ("bouquet_http_requests_total", (("method", "POST"), ("route", "/v1/embeddings"), ("status", "400")))
    assert after[k400] == before.get(k400, 0) + 1
    assert after[("bouquet_http_requests_total", (("method", "GET"), ("route", "other"), ("status", "404")))] >= 1
    k405 = ("bouquet_http_requests_total", (("method", "DELETE"), ("route", "/v1/embeddings"), ("status", "405")))
    assert after[k405] == before.get(k405, 0) + 1  # a known path keeps its route label (was "other")
    names = {n for n, _ in after}
    for n in ("bouquet_http_request_duration_seconds_bucket", "bouquet_tokenization_duration_seconds_count",
              "bouquet_inference_duration_seconds_count", "bouquet_replica_queue_tokens", "bouquet_replica_batch_tokens_bucket",
              "bouquet_replica_batch_sequences_count", "bouquet_replica_cancelled_sequences_total",
              "bouquet_replica_graph_captures_total", "bouquet_replica_graph_replays_total"):
        assert n in names, n
    rep = [lab for n, lab in after if n == "bouquet_replica_batch_tokens_count"][0]
    kc = ("bouquet_replica_batch_tokens_count", rep)
    assert after[kc] > before.get(kc, 0)  # the two sequences ran in at least one more step
    ks = ("bouquet_replica_batch_tokens_sum", rep)
    assert after[ks] - before.get(ks, 0) >= 8  # "metrics one" + "metrics two": at least 4 tokens each


def test_openapi_and_json_404_405(minilm_server):
    spec = httpx.get(minilm_server.url + "/openapi.json").json()
    posts = {"/v1/embeddings", "/v1/rerank", "/v1/score", "/embed", "/rerank", "/tokenize", "/similarity", "/decode",
             "/predict"}
    gets = {"/health", "/metrics", "/v1/models", "/info"}
    assert posts | gets <= set(spec["paths"])
    for p in posts:
        op = spec["paths"][p]["post"]
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        assert schema["required"] and schema["properties"], p
        assert {"200", "400", "413"} <= set(op["responses"]), p
    assert "dimensions" in spec["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    r = httpx.get(minilm_server.url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(minilm_server.url + "/nothing")
    assert r.status_code == 404 and set(r.json()) == {"error", "error_type"}
    # a trailing slash is a JSON 404 naming the route, not Starlette's empty 307 redirect
    r = httpx.post(minilm_server.url + "/v1/embeddings/", json={"input": "x"}, headers={"host": "elsewhere"})
    assert r.status_code == 404 and "location" not in r.headers, (r.status_code, r.headers)
    assert r.json()["error"]["message"].endswith("the route is /v1/embeddings (no trailing slash)"), r.text
    r = httpx.get(minilm_server.url + "/health/")
    assert r.status_code == 404 and set(r.json()) == {"error", "error_type"}, r.text
    r = httpx.get(minilm_server.url + "/v1/embeddings")
    assert r.status_code == 405 and r.headers["allow"] == "POST" and r.json()["error"]["code"] == "method_not_allowed"
    r = httpx.post(minilm_server.url + "/health")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"  # HEAD /health is served too
    tok = httpx.post(minilm_server.url + "/tokenize", json={"inputs": ["hello world"]}).json()
    assert [t["id"] for t in tok[0]] == [101, 7592, 2088, 102] and tok[0][1] == {
        "id": 7592, "text": "hello", "special": False, "start": 0, "stop": 5}
    assert [t["id"] for t in httpx.post(minilm_server.url + "/tokenize",
                                        json={"inputs": "hello", "add_special_tokens": False}).json()[0]] == [7592]


@pytest.mark.parametrize("path,body,ok", [
    ("/v1/embeddings", {"input": "x"}, True),
    ("/v1/embeddings", {"input": "x", "dimensions": None}, True),
    ("/v1/embeddings", {"input": [[101, 102]]}, True),
    ("/v1/embeddings", {"input": ""}, False),
    ("/v1/embeddings", {"input": []}, False),
    ("/v1/embeddings", {"input": ["a", ""]}, False),
    ("/v1/rerank", {"query": "q", "documents": "a"}, True),
    ("/v1/rerank", {"query": "q", "documents": ["a", {"text": "b"}], "top_n": None}, True),
    ("/v1/rerank", {"query": "q", "documents": []}, False),
    ("/v1/rerank", {"query": "", "documents": ["a"]}, False),
    ("/rerank", {"query": "q", "texts": "a"}, True),
    ("/rerank", {"query": "q", "texts": []}, False),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}, True),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": None}, True),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, False),
    ("/similarity", {"inputs": {"source_sentence": "", "sentences": ["b"]}}, False),
    ("/decode", {"ids": [101, 102]}, True),
    ("/decode", {"ids": [[101], [102]]}, True),
    ("/decode", {"ids": []}, False),
    ("/decode", {"ids": [[101], []]}, False),
    ("/", {"inputs": "x"}, True),
    ("/", {"query": "q", "texts": ["a"]}, True),
    ("/invocations", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}, True),
    ("/", {}, False),
    ("/", {"query": "q", "texts": ["a"], "inputs": "x"}, False),
    ("/invocations", {"query": "q", "texts": []}, False),
    ("/", {"inputs": ""}, False),
])
def test_openapi_schema_agrees_with_the_server(minilm_server, path, body, ok):
    """A body /openapi.json allows is served (200); one it rules out is refused (400), and the
    other way round (fresh-clone trial: `documents` as a string and null `dimensions` were served
    but not allowed, empty inputs allowed but refused)."""
    import jsonschema
    spec = httpx.get(minilm_server.url + "/openapi.json").json()
    schema = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    valid = jsonschema.Draft202012Validator(schema).is_valid(body)
    status = httpx.post(minilm_server.url + path, json=body, timeout=30).status_code
    assert (valid, status) == (ok, 200 if ok else 400), (valid, status)


def test_openapi_responses_validate_and_use_3_1_nulls(minilm_server):
    """The document says OpenAPI 3.1, whose schemas are JSON Schema: null is a type there, and 3.0's
    "nullable" (which 3.1 validators ignore) made /tokenize's special tokens (start/stop null) and
    OpenAI errors (param null) fail their own published schemas."""
    import jsonschema
    spec = httpx.get(minilm_server.url + "/openapi.json").json()
    assert spec["openapi"].startswith("3.1") and '"nullable"' not in httpx.get(minilm_server.url + "/openapi.json").text
    ok = spec["paths"]["/tokenize"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    jsonschema.validate(httpx.post(minilm_server.url + "/tokenize", json={"inputs": "hello"}).json(), ok)
    err = httpx.post(minilm_server.url + "/v1/embeddings", json={"input": "x", "dimensions": 0})
    assert err.status_code == 400
    jsonschema.validate({"error": {**err.json()["error"], "param": None, "code": None}},
                        spec["paths"]["/v1/embeddings"]["post"]["responses"]["400"]["content"]["application/json"]["schema"])


@pytest.mark.parametrize("path,body,says", [
    ("/v1/embeddings", {"input": "x", "dimensions": True}, "got true"),
    ("/v1/embeddings", {"input": [None]}, "got null"),
    ("/v1/embeddings", {"input": ["a", 3]}, "got a number"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "hex"}, 'got "hex"'),
    ("/v1/rerank", {"query": "q", "documents": ["a", {"text": None}]}, "got 'text' as null"),
    ("/embed", {"inputs": {"a": 1}}, "got an object"),
])
def test_errors_name_values_and_types_as_json(minilm_server, path, body, says):
    """Messages describe the client's JSON (true, null, "hex", an object), not the gateway's Python
    (True, NoneType, 'hex', dict): fresh-clone trial."""
    r = httpx.post(minilm_server.url + path, json=body, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    message = err["message"] if isinstance(err, dict) else err
    assert says in message, message
    assert not re.search(r"\b(NoneType|True|False|dict)\b|got 'hex'", message), message
    assert minilm_server.embed("next").status_code == 200


def test_head_health_and_retrieve_model(minilm_server):
    """HEAD /health answers like GET without a body (load balancers, uptime checks); GET
    /v1/models/{id} is the OpenAI "Retrieve model", under every name the model is served as."""
    r = httpx.head(minilm_server.url + "/health")
    assert r.status_code == 200 and r.content == b"" and int(r.headers["content-length"]) > 0
    listed = httpx.get(minilm_server.url + "/v1/models").json()["data"][0]
    got = httpx.get(minilm_server.url + "/v1/models/" + listed["id"])  # the id contains a '/'
    assert got.status_code == 200 and got.json() == listed
    r = httpx.get(minilm_server.url + "/v1/models/gpt-4")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    paths = httpx.get(minilm_server.url + "/openapi.json").json()["paths"]
    assert set(paths["/v1/models/{model}"]["get"]["responses"]) == {"200", "401", "404"}  # the ones it answers
    health = paths["/health"]["get"]["responses"]
    assert set(health) == {"200", "503"} and health["503"]["content"] == health["200"]["content"]  # the same object


def test_metrics_sum_every_gateway_worker(tmp_path):
    """--gateway-workers 2: every scrape counts the requests of both workers (each scrape reaches
    one worker; before, it showed that worker's counts only: 0 → 1 → 0 between scrapes), and the
    workers' shared metrics folder is gone after the stop."""
    import os
    import time

    from prometheus_client.parser import text_string_to_metric_families

    srv = BouquetProcess("--gateway-workers", "2", env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        key = ("bouquet_http_requests_total", (("method", "POST"), ("route", "/v1/embeddings"), ("status", "200")))
        for i in range(8):
            with httpx.Client() as fresh:  # a new connection each: the kernel spreads them over the workers
                assert fresh.post(srv.url + "/v1/embeddings", json={"input": f"text {i}"}, timeout=30).status_code == 200
        seen = set()
        for _ in range(6):
            with httpx.Client() as fresh:
                text = fresh.get(srv.url + "/metrics", timeout=10).text
            values = {(s.name, tuple(sorted(s.labels.items()))): s.value
                      for fam in text_string_to_metric_families(text) for s in fam.samples}
            seen.add(values.get(key))
            assert any(n == "bouquet_replica_up" for n, _ in values)  # the replica metrics are there too
        assert seen == {8.0}, seen
        assert list(tmp_path.glob("bouquet-metrics-*"))  # the shared folder, while it runs
    finally:
        srv.stop()
    time.sleep(0.5)
    assert list(tmp_path.glob("bouquet-metrics-*")) == []
