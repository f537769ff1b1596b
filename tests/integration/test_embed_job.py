"""`bouquet embed` end to end, on CPU, with real processes.

All unique STSb sentences (dev + test) go through the real command; the vectors must equal what a
real `bouquet serve` returns on /v1/embeddings, survive a SIGKILL mid-run and a re-run without
duplicates, and come out the same from the Ray Data path, which resumes the same folder. A 20,000-row
synthetic input checks that memory stays under a fixed bound; a tiny random model runs the input edge
cases (CSV cells as written, one error line per bad row).
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bouquet.jobs.writer import MANIFEST, read_output

from bouquet.bench.models import TINY_BERT, make_model_dir
from bouquet.bench.stream import run_job, write_synthetic
from helpers import STS_DIR as STSB

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def embed_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "bouquet", "embed", *args, "--no-progress"]


def run_embed(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(embed_cmd(*args), env=_env(), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def stsb_sentences() -> list[str]:
    """Unique sentences of the STSb test split (2,552) in first-seen order (tab-separated, no
    quoting; the two sentences are columns 5 and 6; some rows carry extra columns)."""
    seen: dict[str, None] = {}
    with open(STSB / "sts-test.csv", encoding="utf-8", newline="") as f:
        for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            seen.update(dict.fromkeys(row[5:7]))
    return list(seen)


def _write_stsb(path: Path, rows: int | None = None) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i, s in enumerate(stsb_sentences()[:rows]):
            f.write(json.dumps({"id": f"sts-{i}", "text": s}) + "\n")
    return path


@pytest.fixture(scope="module")
def stsb_input(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_stsb(tmp_path_factory.mktemp("stsb") / "stsb.jsonl")


@pytest.fixture(scope="module")
def stsb_output_dir(stsb_input: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stsb-out") / "vectors"
    run_embed(str(stsb_input), "--output", str(out), "--device", "cpu", "--shard-rows", "500")
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["complete"] and manifest["rows"] == len(stsb_sentences())
    return out


@pytest.fixture(scope="module")
def stsb_output(stsb_output_dir: Path) -> pa.Table:
    return read_output(stsb_output_dir)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(TINY_BERT, tmp_path_factory.mktemp("tiny"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def vectors_of(table: pa.Table) -> np.ndarray:
    col = table.column("vector").combine_chunks()
    return col.flatten().to_numpy(zero_copy_only=False).reshape(len(table), col.type.list_size)


def test_stsb_vectors_equal_the_servers(stsb_output: pa.Table) -> None:
    sentences = stsb_sentences()
    assert stsb_output.column("id").to_pylist() == [f"sts-{i}" for i in range(len(sentences))]
    assert stsb_output.schema.field("vector").type == pa.list_(pa.float32(), 384)
    job = vectors_of(stsb_output)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "bouquet", "serve", "--port", str(port), "--device", "cpu",
                               "--log-level", "warning"], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stderr.read().decode()[-3000:] if server.stderr else "server died"
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not become healthy in 120 s"
            time.sleep(0.5)
        served = []
        rows = list(range(0, len(sentences), 3))  # a third of the rows, spread over every shard
        for lo in range(0, len(rows), 1024):
            r = httpx.post(f"{base}/v1/embeddings", json={"input": [sentences[i] for i in rows[lo:lo + 1024]]}, timeout=300)
            assert r.status_code == 200, r.text
            served.extend(d["embedding"] for d in r.json()["data"])
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
    cos = cosines(job[rows], np.asarray(served, dtype=np.float32))
    assert cos.min() >= 0.99999, f"worst cosine {cos.min():.7f} at row {int(cos.argmin())}"


def test_sigkill_mid_run_then_resume_gives_the_same_rows(stsb_output: pa.Table, tmp_path: Path) -> None:
    out = tmp_path / "resumed"
    stsb_output = stsb_output.slice(0, 1200)  # the run's first 1,200 rows: 6 shards of 200
    args = (str(_write_stsb(tmp_path / "part.jsonl", 1200)), "--output", str(out), "--device", "cpu", "--shard-rows", "200")
    proc = subprocess.Popen(embed_cmd(*args), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    manifest = out / MANIFEST
    deadline = time.monotonic() + 240
    while not (manifest.exists() and json.loads(manifest.read_text())["done"]):
        assert proc.poll() is None, f"job ended before the kill: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}"
        assert time.monotonic() < deadline, "no shard finished in 240 s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = json.loads(manifest.read_text())
    assert not before["complete"] and 0 < len(before["done"]) < 6, before
    rerun = run_embed(*args)
    skipped = int(rerun.stderr.strip().splitlines()[-1].split(", ")[-1].split()[0])
    assert skipped >= len(before["done"]), rerun.stderr[-500:]
    assert not list(out.glob(".*.tmp"))
    final = read_output(out)
    ids = final.column("id").to_pylist()
    assert len(ids) == len(set(ids)) == len(stsb_output)
    assert ids == stsb_output.column("id").to_pylist()
    np.testing.assert_allclose(vectors_of(final), vectors_of(stsb_output), atol=2e-6)
    # A finished job is not redone; a changed setting is refused rather than mixed in.
    assert "0 shards written" in run_embed(*args).stderr
    bad = subprocess.run(embed_cmd(*args[:-1], "300"), env=_env(), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "shard_rows" in bad.stderr


def test_ctrl_c_says_how_to_resume(stsb_input: Path, tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) mid-run: exit 130 with one line saying the finished shards stay and the same
    command resumes (a fresh-clone trial found the job ending silently)."""
    out = tmp_path / "interrupted"
    # A shell runs background jobs with SIGINT ignored, and Python keeps an ignored SIGINT ignored: a
    # test run started with `&` would see the job finish untouched. Ctrl-C reaches a foreground job
    # with the default disposition, so the job gets that.
    proc = subprocess.Popen(embed_cmd(str(stsb_input), "--output", str(out), "--device", "cpu", "--shard-rows", "500"),
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    manifest = out / MANIFEST
    deadline = time.monotonic() + 240
    while not (manifest.exists() and json.loads(manifest.read_text())["done"]):
        assert proc.poll() is None and time.monotonic() < deadline, "no shard finished before the job ended"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-1000:]
    assert f"interrupted: the finished shards stay in {out}; the same command resumes" in err.decode(), err.decode()[-1000:]


def test_a_model_the_engine_refuses_leaves_the_output_folder_unwritten(tmp_path: Path) -> None:
    """The engine loads before the job writes anything: a refused model (here fp8 for a model whose
    fp8 outputs miss the load-time accuracy gate: an MLP input column the norm always zeroes, whose
    weights are a million, so per-channel fp8 scales leave the others 0) leaves no manifest, so the
    same --output takes the corrected command."""
    from safetensors.torch import load_file, save_file

    from tests.fixtures.tiny_models import make_tiny_model

    model = make_tiny_model("modernbert", tmp_path / "m")
    state = load_file(str(model / "model.safetensors"))
    for name, t in state.items():
        if name.endswith("mlp_norm.weight"):
            t[0] = 0.0  # feature 0 of the MLP's input is exactly 0 (no norm bias) ...
        elif name.endswith("mlp.Wi.weight"):
            t[:, 0] = 1e6  # ... so in fp32 this column adds nothing
    save_file(state, str(model / "model.safetensors"), metadata={"format": "pt"})
    inp, out = tmp_path / "in.jsonl", tmp_path / "out"
    inp.write_text("".join(json.dumps({"id": str(i), "text": f"sentence number {i}"}) + "\n" for i in range(20)))
    args = (str(inp), "--output", str(out), "--model", str(model), "--device", "cpu")
    bad = subprocess.run(embed_cmd(*args, "--quantization", "fp8"), env=_env(), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--quantization fp8 is refused for this model" in bad.stderr, bad.stderr[-1500:]
    assert not out.exists()
    run_embed(*args)
    assert json.loads((out / MANIFEST).read_text())["complete"]


@pytest.mark.parametrize("flag,value,allowed", [("--device", "gpu", "auto, cpu, cuda (or cuda:N)"),
                                                 ("--device", "cpu:0", "auto, cpu, cuda (or cuda:N)"),
                                                 ("--device", "cuda:x", "auto, cpu, cuda (or cuda:N)"),
                                                 ("--dtype", "fp16", "auto, float32, float16, bfloat16")])
def test_a_bad_device_or_dtype_is_one_error_line(tmp_path: Path, flag: str, value: str, allowed: str) -> None:
    # `--device gpu` (what a new user types) ended in torch's RuntimeError and a traceback; a bad
    # --dtype is worded as `serve` words it.
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"text": "hello"}\n')
    p = subprocess.run(embed_cmd(str(inp), "-o", str(tmp_path / "out"), flag, value), env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1] == f"error: {flag} must be one of {allowed}, got {value!r}"
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # starts a local Ray cluster
def test_ray_path_resumes_the_same_folder(stsb_input: Path, stsb_output_dir: Path, stsb_output: pa.Table,
                                          tmp_path: Path) -> None:
    """--ray writes what the in-process job writes (part-NNNNN shards, the manifest) and resumes it:
    here an in-process run that stopped with shards 1 and 3 unfinished (one of them left on disk,
    as a crash between the rename and the manifest would) is finished by --ray, and the folder then
    equals an uninterrupted run's; run again, the finished job does nothing."""
    out = tmp_path / "ray"
    shutil.copytree(stsb_output_dir, out)
    manifest = json.loads((out / MANIFEST).read_text())
    shards = len(manifest["done"])
    for k in ("1", "3"):
        del manifest["done"][k]
    manifest["complete"] = False
    (out / MANIFEST).write_text(json.dumps(manifest))
    (out / "part-00003.parquet").unlink()
    args = (str(stsb_input), "--output", str(out), "--device", "cpu", "--shard-rows", "500", "--ray", "--workers", "2")
    p = run_embed(*args, timeout=400)
    assert p.stderr.strip().endswith(f"2 shards written, {shards - 2} already done"), p.stderr[-1500:]
    assert json.loads((out / MANIFEST).read_text())["complete"]
    assert sorted(f.name for f in out.iterdir()) == sorted(f.name for f in stsb_output_dir.iterdir())
    table = read_output(out)
    assert table.column("id").to_pylist() == stsb_output.column("id").to_pylist()
    assert table.schema == stsb_output.schema
    cos = cosines(vectors_of(table), vectors_of(stsb_output))
    assert cos.min() >= 0.99999
    assert "0 shards written" in run_embed(*args).stderr  # decided from the manifest, before Ray starts


def test_csv_cells_are_embedded_as_written(tiny_model: Path, tmp_path: Path) -> None:
    """`0123,007` → id "0123", text "007" (pyarrow's type inference made them 123 and "7"); a column
    numeric for 200,000 rows and then `hello world` (inferred from the first 1 MiB block, it aborted
    the job after shards were written): every row embedded."""
    src = tmp_path / "in.csv"
    with open(src, "w", encoding="utf-8") as f:
        f.write("id,text\n0123,007\n123,1.50\n")
        f.writelines(f"{i},{i % 1000}\n" for i in range(200_000))
        f.write("x,hello world\n")
    common = ("--model", str(tiny_model), "--device", "cpu")
    run_embed(str(src), "--output", str(tmp_path / "out"), "--shard-rows", "100000", *common)
    table = read_output(tmp_path / "out")
    ids = table.column("id").to_pylist()
    assert len(ids) == 200_003 and ids[:3] == ["0123", "123", "0"] and ids[-1] == "x"
    ref = tmp_path / "ref.txt"  # a text file is read as text: its vectors are the reference
    ref.write_text("007\n7\n1.50\n1.5\nhello world\n")
    run_embed(str(ref), "--output", str(tmp_path / "ref"), *common)
    want, got = vectors_of(read_output(tmp_path / "ref")), vectors_of(table)
    np.testing.assert_allclose(got[[0, 1, -1]], want[[0, 2, 4]], atol=1e-5)
    assert cosines(want[[0, 2]], want[[1, 3]]).max() < 0.9999  # "7" or "1.5" would have been told apart


def _bad_parquet(path: Path) -> None:
    pq.write_table(pa.table({"text": pa.array([b"ok", b"bad \xff"], pa.binary())}), path)


@pytest.mark.parametrize("name,write,where,ray", [
    ("object.jsonl", lambda p: p.write_text('{"text": {"a": 1}}\n'), "line 1: 'text' is a JSON object", False),
    ("bytes.jsonl", lambda p: p.write_bytes(b'{"text": "ok"}\n{"text": "bad \xff"}\n'), "line 2: 'text' is not valid UTF-8",
     False),
    ("bytes.parquet", _bad_parquet, "row 2: 'text' is not valid UTF-8", False),
    ("bytes.parquet", _bad_parquet, "row 2: 'text' is not valid UTF-8", True),  # found before Ray starts
])
def test_a_bad_row_is_one_error_line(tiny_model: Path, tmp_path: Path, name: str, write: Any, where: str,
                                     ray: bool) -> None:
    """A bad row ends the job with exit 2 and one `error:` line naming the file and the line (was: a
    traceback, or an error without either); no shard, and the job is not marked complete."""
    src = tmp_path / name
    write(src)
    out = tmp_path / "out"
    p = subprocess.run(embed_cmd(str(src), "--output", str(out), "--model", str(tiny_model), "--device", "cpu",
                                 *(["--ray"] if ray else [])), env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert [line for line in p.stderr.splitlines() if line.startswith("error:")] == \
        [line for line in p.stderr.splitlines() if line.startswith(f"error: {src}: {where}")], p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1].startswith(f"error: {src}: {where}")
    assert not list(out.glob("part-*"))
    assert not (out / MANIFEST).exists() if ray else not json.loads((out / MANIFEST).read_text())["complete"]


def test_a_bad_row_after_finished_shards_leaves_only_whole_shards(tiny_model: Path, tmp_path: Path) -> None:
    """Invalid UTF-8 on line 5,001 of a text file, 1,000-row shards: the rows before it are embedded
    and their shards stay listed, whole; the shard it falls in is neither written nor listed; the same
    command run again stops at the same line instead of taking the job for done. (The tokenizer's
    queued work used to be cancelled at the error: a CancelledError traceback.)"""
    src, out = tmp_path / "docs.txt", tmp_path / "out"
    src.write_bytes(b"".join(f"document {i}\n".encode() for i in range(5000)) + b"bad \xff byte\nafter\n")
    cmd = embed_cmd(str(src), "--output", str(out), "--model", str(tiny_model), "--device", "cpu", "--shard-rows", "1000")
    for _ in range(2):
        p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
        assert p.stderr.strip().splitlines()[-1] == f"error: {src}: line 5001: not valid UTF-8 (byte 0xff at column 5)"
        manifest = json.loads((out / MANIFEST).read_text())
        assert not manifest["complete"] and set(manifest["done"]) == {"0", "1", "2", "3"}, manifest
        assert all(rows == 1000 for rows in manifest["done"].values()), manifest
        assert sorted(f.name for f in out.glob("part-*")) == [f"part-{int(k):05d}.parquet" for k in sorted(manifest["done"])]


@pytest.mark.slow
def test_streaming_20k_rows_stays_under_a_fixed_memory_bound(tmp_path: Path) -> None:
    model = make_model_dir(TINY_BERT, tmp_path)
    src = write_synthetic(tmp_path / "docs.jsonl", 20_000)
    res = run_job([str(src), "--output", str(tmp_path / "out"), "--model", str(model), "--device", "cpu",
                   "--shard-rows", "2000", "--no-progress"])
    assert res["rows"] == 20_000
    out = read_output(tmp_path / "out")
    assert out.column("id").to_pylist() == [f"doc-{i}" for i in range(20_000)]
    # Model + torch + tokenizer ≈ 450 MiB on CPU; the bound leaves room for allocator noise but not
    # for holding the input, its tokens or its vectors.
    assert res["peak_rss_mb"] < 800, res


def test_output_inside_the_input_folder_is_not_read_back(tmp_path: Path) -> None:
    """An output folder inside the input folder (named like any other) holds the job's own shards:
    the re-run must not take them for input (the input fingerprint would change and the resume be
    refused); hidden and '_' folders (``.git/``) are skipped as hidden files are."""
    inp = tmp_path / "docs"
    (inp / ".git").mkdir(parents=True)
    (inp / "a.jsonl").write_text("".join(json.dumps({"id": str(i), "text": f"sentence {i}"}) + "\n" for i in range(12)))
    (inp / ".git" / "x.jsonl").write_text(json.dumps({"id": "x", "text": "not input"}) + "\n")
    out = inp / "vectors"
    args = (str(inp), "--output", str(out), "--device", "cpu")
    run_embed(*args)
    first = json.loads((out / MANIFEST).read_text())
    assert first["complete"] and first["rows"] == 12, first
    again = run_embed(*args)  # the same command: a finished job, not "the input changed"
    # (it said "embedded 0 rows (tokens not counted) in 0s: 0 rows/s, tokens/s n/a; ...")
    assert again.stderr.strip().splitlines()[-1] == (f"nothing to embed: the job in {out} is complete; 0 shards written, "
                                                     "1 already done"), again.stderr[-1500:]
    assert json.loads((out / MANIFEST).read_text())["rows"] == 12, again.stderr[-1500:]
