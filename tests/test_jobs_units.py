"""The parts of the batch job on their own: readers, shard cutting, packing, output files, and the
GPU benchmark script's CPU smoke mode."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from bouquet.jobs.packer import Group, Packer, drain, scatter
from bouquet.jobs.reader import InputError, discover, read_chunks, resolve_id_column
from bouquet.jobs.writer import Manifest, ResumeError, ShardWriter, read_output

REPO = Path(__file__).resolve().parents[1]
TEXTS = ["first doc", "second, with a comma", 'third "quoted"', "fourth\twith a tab", "fifth", "sixth", "seventh"]


def write_all_formats(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": [f"d{i}" for i in range(len(TEXTS))], "text": TEXTS, "extra": list(range(len(TEXTS)))})
    paths = {"parquet": folder / "a.parquet", "csv": folder / "b.csv", "jsonl": folder / "c.jsonl"}
    pq.write_table(table, paths["parquet"], row_group_size=3)
    pcsv.write_csv(table, paths["csv"])
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))
    return paths


def rows_of(path: Path, id_column: str | None = None, chunk: int = 2, shard: int = 4) -> list[tuple[object, str]]:
    files = discover(path)
    col = resolve_id_column(files, "text", id_column)
    return [(i, t) for c in read_chunks(files, "text", col, chunk, shard) for i, t in zip(c.ids.to_pylist(), c.texts)]


def test_every_format_reads_the_same_rows(tmp_path: Path) -> None:
    expected = [(f"d{i}", t) for i, t in enumerate(TEXTS)]
    for p in write_all_formats(tmp_path).values():
        assert rows_of(p) == expected, p
    txt = tmp_path / "t.txt"
    txt.write_text("".join(t.replace("\t", " ") + "\n" for t in TEXTS))
    assert rows_of(txt) == [(i, t.replace("\t", " ")) for i, t in enumerate(TEXTS)]


def test_folder_is_one_sequence_and_chunks_never_cross_shards(tmp_path: Path) -> None:
    write_all_formats(tmp_path / "in")
    files = discover(tmp_path / "in")
    assert [f.fmt for f in files] == ["parquet", "csv", "jsonl"]
    chunks = list(read_chunks(files, "text", "id", chunk_rows=3, shard_rows=5))
    assert [(c.start, c.end) for c in chunks] == [(0, 3), (3, 5), (5, 8), (8, 10), (10, 13), (13, 15), (15, 18),
                                                  (18, 20), (20, 21)]
    assert sum(len(c.texts) for c in chunks) == 3 * len(TEXTS)
    skipped = list(read_chunks(files, "text", "id", 3, 5, skip_shards=frozenset({0, 2})))
    assert [c.start for c in skipped] == [5, 8, 15, 18, 20]


def test_missing_columns_and_unknown_files_are_named(tmp_path: Path) -> None:
    p = write_all_formats(tmp_path)["csv"]
    with pytest.raises(InputError, match="no column 'body'.*'text'"):
        resolve_id_column(discover(p), "body", None)
    with pytest.raises(InputError, match="no column 'key'"):
        resolve_id_column(discover(p), "text", "key")
    (tmp_path / "x.docx").write_text("?")
    with pytest.raises(InputError, match="unknown input type"):
        discover(tmp_path / "x.docx")
    (tmp_path / "nulls.jsonl").write_text('{"text": "a"}\n{"text": null}\n')
    with pytest.raises(InputError, match=r"line 2 \(counting from 1\) has no 'text'"):  # JSONL has no header
        rows_of(tmp_path / "nulls.jsonl")


@pytest.mark.parametrize("body,message", [
    ('{"text": "ok"}\n{"text": "broken\n{"text": "after"}\n', r"line 2 is not valid JSON \(Unterminated string"),
    ('{"text": "ok"}\n\n{"text": 5}\n', r"line 3: 'text' is a JSON number, but a string on line 1"),
    ('[1, 2]\n', "line 1 is not a JSON object"),
    ("", "the file holds no rows"),
    ('{"text": null}\n{"text": "a"}\n{"text": 3}\n', r"line 3: 'text' is a JSON number, but a string on line 2"),
    ('\ufeff{"text": "a"} {"text": "b"}\n{"text": [1]}\n', r"line 2: 'text' is a JSON array, but a string on line 1"),
])
def test_malformed_jsonl_names_the_file_and_line(tmp_path: Path, body: str, message: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(body)
    with pytest.raises(InputError, match=rf"bad.jsonl: cannot be read as JSONL: {message}"):
        resolve_id_column(discover(p), "text", None)  # the job's first read: the columns
        rows_of(p)


def test_packer_respects_budgets_and_keeps_order() -> None:
    rng = np.random.default_rng(0)
    groups = [Group([np.full(int(n), 7, np.int32) for n in rng.integers(1, 40, size=50)], k, 2) for k in range(3)]
    packer = Packer(max_tokens=100, max_seqs=8)
    for g in groups:
        packer.add(g)
    long = Group([np.ones(300, np.int32)], "long", 2)  # longer than the budget: a batch of its own
    packer.add(long)
    seen = []
    for batch, segs in drain(packer):
        assert batch.num_seqs <= 8 and (batch.num_tokens <= 100 or batch.num_seqs == 1)
        rows = np.repeat(np.arange(batch.num_seqs, dtype=np.float32)[:, None], 2, 1)
        scatter(rows, segs)
        seen.extend((s.run.owner, r) for s in segs for r in range(s.lo, s.hi))
    assert seen == [(g.owner, r) for g in [*groups, long] for r in range(g.rows)]
    assert all(g.filled == g.rows for g in groups) and packer.pending_tokens == 0


def test_npy_output_and_resume_refusal(tmp_path: Path) -> None:
    settings = {"format": "npy", "output_dtype": "float16", "shard_rows": 2}
    m = Manifest.open(tmp_path, settings)
    w = ShardWriter(tmp_path, "npy", "float16", m)
    vec = np.arange(12, dtype=np.float32).reshape(4, 3)
    w.write(1, pa.array(["c", "d"]), vec[2:])
    w.write(0, pa.array(["a", "b"]), vec[:2])
    w.finish()
    assert np.load(tmp_path / "part-00001.npy").dtype == np.float16
    out = read_output(tmp_path)
    assert out.column("id").to_pylist() == ["a", "b", "c", "d"]
    assert out.schema.field("vector").type == pa.list_(pa.float16(), 3)
    assert Manifest.open(tmp_path, settings).complete
    with pytest.raises(ResumeError, match="output_dtype"):
        Manifest.open(tmp_path, {**settings, "output_dtype": "float32"})


def test_gpu_bench_runs_tiny_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    p = subprocess.run([sys.executable, str(REPO / "bench" / "embed_gpu.py"), str(out), "--tiny", "--device", "cpu",
                        "--rows", "60", "--work-dir", str(tmp_path / "w")], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["rows"] == 60 and res["model_shape"] == "tiny" and res["engine_rows_per_s"] > 0
    assert res["job_rows_per_s"] > 0 and 16 <= res["token_length_min_median_max"][0] <= res["token_length_min_median_max"][2] <= 512
    assert len(read_output(tmp_path / "w" / "out")) == 60
