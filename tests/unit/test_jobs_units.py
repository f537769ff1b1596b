"""The parts of the batch job on their own: readers, shard cutting, packing, output files, and the
GPU benchmark script's CPU smoke mode."""
from __future__ import annotations

import json
import os
import re
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

REPO = Path(__file__).resolve().parents[2]
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
    with pytest.raises(InputError, match=r"nulls.jsonl: line 2: no 'text' value$"):  # JSONL has no header
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


@pytest.mark.parametrize("name,body", [("h.csv", "id,text\n"), ("h.tsv", "id\ttext\n")])
def test_csv_without_rows_is_named(tmp_path: Path, name: str, body: str) -> None:
    # a header alone was told "h.csv has no column 'text'; its columns are []"
    (tmp_path / name).write_text(body)
    kind = name.rsplit(".", 1)[1].upper()
    with pytest.raises(InputError, match=rf"{name}: cannot be read as {kind}: the file holds no rows$"):
        resolve_id_column(discover(tmp_path / name), "text", None)


def test_csv_and_tsv_cells_are_read_as_written(tmp_path: Path) -> None:
    """CSV has no types: pyarrow's inference read `0123` as the int 123 and `007` as 7."""
    (tmp_path / "a.csv").write_text('id,text\n0123,007\n123,1.50\n"0x1F","1e3"\n')
    (tmp_path / "b.tsv").write_text("id\ttext\n0123\t007\n123\t1.50\n0x1F\t1e3\n")
    for name in ("a.csv", "b.tsv"):
        assert rows_of(tmp_path / name) == [("0123", "007"), ("123", "1.50"), ("0x1F", "1e3")], name
    # a quoted value with line breaks last, and no final line break: read, not refused
    (tmp_path / "c.csv").write_text('id,text\n1,"two\nlines"\n2,"last\none"')
    assert rows_of(tmp_path / "c.csv") == [("1", "two\nlines"), ("2", "last\none")]


def _parquet(path: Path, **columns: pa.Array) -> bytes:
    pq.write_table(pa.table(columns), path)
    return path.read_bytes()


# One row per kind of bad row: the file's content, then the message after "FILE: " (a regex).
BAD_ROWS = [
    ("a.jsonl", b'{"text": "ok"}\n{"text": {"a": 1}}\n', r"cannot be read as JSONL: line 2: 'text' is a JSON object, but a string on line 1"),
    ("a.jsonl", b'{"text": {"a": 1}}\n', r"line 1: 'text' is a JSON object; documents must be strings"),
    ("a.jsonl", b'\n{"text": [1, 2]}\n', r"line 2: 'text' is a JSON array; documents must be strings"),
    ("a.jsonl", b'{"text": 1.50}\n', r"line 1: 'text' is a JSON number; documents must be strings"),
    ("a.jsonl", b'{"text": "ok"} {"text": "x\xff"}\n', r"line 1: 'text' is not valid UTF-8 \(byte 0xff at position 2 of"),
    ("a.jsonl", b'{"text": "ok"}\n\n{"text": "bad \xff"}\n', r"line 3: 'text' is not valid UTF-8 \(byte 0xff at position 5"),
    ("a.jsonl", b'{"id": 1.50, "text": "a"}\n', r"line 1: 'id' is a JSON number; ids must be integers or strings"),
    ("a.jsonl", b'{"id": "x", "text": "a"}\n{"id": null, "text": "b"}\n', r"line 2: no 'id' value"),
    ("a.txt", b"ok\nfine\nbad \xff here\n", r"line 3: not valid UTF-8 \(byte 0xff at column 5\)"),
    ("a.csv", b'id,text\n1,"two\nlines"\n2,\xff\n', r"line 4 \(data row 2\): 'text' is not valid UTF-8"),
    ("a.csv", b"id,text\n1,a\n,b\n", r"line 3 \(data row 2\): empty 'id'"),
    ("a.tsv", b"id\ttext\n1\ta\n2\tb\tc\n", r"cannot be read as TSV: line 3 \(data row 2\): 3 fields where the header has 2"),
    # a stray opening quote: pyarrow read the rest of the file as that one value (997 rows lost, exit 0)
    ("a.csv", b'id,text\n1,a\n2,"stray\n3,c\n4,d\n', r"line 3 \(data row 2\): a quoted value is not closed"),
    ("a.csv", b'id,text\n1,a\n2,"stray\n3,c', r"line 3 \(data row 2\): a quoted value is not closed"),
    ("a.tsv", b'text\tid\na\t1\nb\t"2\nc\t3\n', r"line 3 \(data row 2\): a quoted value is not closed"),
    ("a.parquet", None, r"row 3: 'text' is not valid UTF-8 \(byte 0xff at position 5"),
]


@pytest.mark.parametrize("name,body,message", BAD_ROWS)
def test_every_bad_row_names_its_file_and_line(tmp_path: Path, name: str, body: bytes | None, message: str) -> None:
    p = tmp_path / name
    if body is None:  # a binary column (Parquet's type for bytes) whose third value is not UTF-8
        _parquet(p, id=pa.array([1, 2, 3]), text=pa.array([b"ok", b"fine", b"bad \xff"], pa.binary()))
    else:
        p.write_bytes(body)
    with pytest.raises(InputError, match=rf"^{re.escape(str(p))}: {message}"):
        rows_of(p)


def test_typed_columns_keep_their_schema(tmp_path: Path) -> None:
    """Parquet and JSONL carry types: integer ids stay int64, string ids stay as written, a binary
    text column holding UTF-8 is text."""
    p = tmp_path / "a.parquet"
    _parquet(p, id=pa.array([7, 8], pa.int32()), text=pa.array(["é".encode(), b"x"], pa.binary()))
    assert rows_of(p) == [(7, "é"), (8, "x")]
    (tmp_path / "b.jsonl").write_text('{"id": 1, "text": "a"}\n{"id": 2, "text": "b"}\n')
    assert rows_of(tmp_path / "b.jsonl") == [(1, "a"), (2, "b")]
    (tmp_path / "c.jsonl").write_text('{"id": "0123", "text": "007"}\n')
    assert rows_of(tmp_path / "c.jsonl") == [("0123", "007")]


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
    with pytest.raises(ResumeError, match=r"holds a job with other settings: output_dtype 'float16' \(now 'float32'\); "):
        Manifest.open(tmp_path, {**settings, "output_dtype": "float32"})
    with pytest.raises(ResumeError, match=r"other settings: the input files \(their list, sizes or modification times\), "
                                          r"shard_rows 2 \(now 3\); use another --output or --overwrite$"):
        Manifest.open(tmp_path, {**settings, "shard_rows": 3, "input": [["a.jsonl", 1, 2]]})


def test_gpu_bench_runs_tiny_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    p = subprocess.run([sys.executable, "-m", "bouquet", "bench", "embed", str(out), "--tiny", "--device", "cpu",
                        "--rows", "60", "--work-dir", str(tmp_path / "w")], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["rows"] == 60 and res["model_shape"] == "tiny" and res["engine_rows_per_s"] > 0
    assert res["job_rows_per_s"] > 0 and 16 <= res["token_length_min_median_max"][0] <= res["token_length_min_median_max"][2] <= 512
    assert len(read_output(tmp_path / "w" / "out")) == 60
