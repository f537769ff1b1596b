"""Streaming readers for batch jobs: JSONL, CSV/TSV, Parquet and plain text, via pyarrow.

Every reader yields small Arrow slices, so memory stays bounded by a few blocks whatever the file
size. ``read_chunks`` turns the files of one input into one global row sequence cut into chunks
that never straddle a shard boundary (shard ``s`` = global rows ``[s*S, (s+1)*S)``), which is what
makes output shards deterministic and resumable.

What this module does not own: tokenization, the embedding pipeline, output files.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq

Format = Literal["jsonl", "csv", "tsv", "parquet", "text"]
SUFFIXES: dict[str, Format] = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
    ".csv": "csv", ".tsv": "tsv",
    ".parquet": "parquet", ".pq": "parquet",
    ".txt": "text", ".text": "text",
}
_BLOCK_BYTES = 1 << 20  # pyarrow streaming block size: bounds memory per reader
_SLICE_ROWS = 4096  # rows per slice from Parquet and text files


class InputError(ValueError):
    """The input is missing, of an unknown type, or lacks a required column; the message says which."""


@dataclass(frozen=True)
class InputFile:
    path: Path
    fmt: Format


@dataclass(frozen=True)
class RowChunk:
    """Consecutive rows of the input.

    start  global index of the first row (0-based, over all files in order)
    ids    [n] int64 or string Arrow array
    texts  n documents
    """

    start: int
    ids: pa.Array
    texts: list[str]

    @property
    def end(self) -> int:
        return self.start + len(self.texts)


def discover(path: str | Path, exclude: str | Path | None = None) -> list[InputFile]:
    """A file, or the supported files of a folder (recursively, sorted by relative path).

    Hidden files and folders and those starting with '_' are ignored (``.git/``, ``_out/``), and so is
    ``exclude`` (the job's output folder, when it lies inside the input: a re-run must not read its
    own shards as input). Raises InputError when nothing is found or a single file has an unknown suffix.
    """
    p = Path(path)
    if p.is_file():
        fmt = SUFFIXES.get(p.suffix.lower())
        if fmt is None:
            raise InputError(f"{p}: unknown input type {p.suffix!r}; supported: {sorted(SUFFIXES)}")
        return [InputFile(p, fmt)]
    if not p.is_dir():
        raise InputError(f"input {p} does not exist")
    skip = Path(exclude).resolve() if exclude is not None else None

    def wanted(f: Path) -> bool:
        if not f.is_file() or f.suffix.lower() not in SUFFIXES:
            return False
        if any(part.startswith((".", "_")) for part in f.relative_to(p).parts):
            return False
        return skip is None or not f.resolve().is_relative_to(skip)

    files = [InputFile(f, SUFFIXES[f.suffix.lower()])
             for f in sorted(p.rglob("*"), key=lambda f: str(f.relative_to(p))) if wanted(f)]
    if not files:
        raise InputError(f"folder {p} holds no input files ({', '.join(sorted(SUFFIXES))})")
    return files


def fingerprint(files: list[InputFile]) -> list[list[object]]:
    """[path, bytes, mtime_ns] per file: a resumed job refuses to continue on changed input."""
    out: list[list[object]] = []
    for f in files:
        st = f.path.stat()
        out.append([str(f.path.resolve()), st.st_size, st.st_mtime_ns])
    return out


def _columns(f: InputFile) -> list[str]:
    """Column names, read from the first block only."""
    if f.fmt == "text":
        return []
    if f.fmt == "parquet":
        return pq.ParquetFile(f.path).schema_arrow.names
    return next(iter(_open_table_stream(f, None)), pa.table({})).column_names


def resolve_id_column(files: list[InputFile], text_column: str, id_column: str | None) -> str | None:
    """Check that every file has the text column; decide the id column.

    ``id_column`` None means: use a column named 'id' when the first file has one, else the global
    row index. Raises InputError naming the file and its columns when a column is missing.
    """
    first = _columns(files[0])
    chosen = id_column if id_column is not None else ("id" if "id" in first else None)
    for f in files:
        cols = _columns(f) if f is not files[0] else first
        if f.fmt == "text":
            if id_column is not None:
                raise InputError(f"{f.path}: plain-text input has no columns, so --id-column {id_column!r} cannot apply")
            if chosen is not None:
                raise InputError(f"{f.path}: plain text mixed with files that carry an {chosen!r} column")
            continue
        missing = [c for c in (text_column, chosen) if c is not None and c not in cols]
        if missing:
            raise InputError(f"{f.path} has no column {missing[0]!r}; its columns are {cols}")
    return chosen


def _open_table_stream(f: InputFile, columns: list[str] | None) -> Iterator[pa.Table]:
    """Arrow slices of a JSONL/CSV/TSV/Parquet file. Raises InputError naming the file (and, for
    JSONL, the first line that is not a JSON object or whose values change type) when pyarrow
    cannot read it."""
    try:
        yield from _table_stream(f, columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        where = _first_bad_jsonl_line(f.path) if f.fmt == "jsonl" else None
        raise InputError(f"{f.path}: cannot be read as {f.fmt.upper()}: {where or e}") from None


_JSON_KINDS = {str: "string", int: "number", float: "number", bool: "boolean", dict: "object", list: "array"}


def _first_bad_jsonl_line(path: Path) -> str | None:
    """Where a JSONL file goes wrong, counted from line 1: a line that is not a JSON object, or a
    field whose JSON type differs from its type on an earlier line (pyarrow's row numbers count
    from 0 within a block, and its parse errors do not say what is wrong). None if no line is."""
    import json

    decoder = json.JSONDecoder()
    kinds: dict[str, tuple[str, int]] = {}  # field → (its first non-null JSON type, that line)
    rows = 0
    with open(path, encoding="utf-8-sig", errors="replace") as fh:  # a BOM is fine for pyarrow too
        for n, line in enumerate(fh, 1):
            pos, line = 0, line.strip()
            while pos < len(line):  # pyarrow takes several objects on one line as well
                try:
                    obj, end = decoder.raw_decode(line, pos)
                except json.JSONDecodeError as e:
                    return f"line {n} is not valid JSON ({e.msg}, column {e.colno})"
                if not isinstance(obj, dict):
                    return f"line {n} is not a JSON object"
                rows += 1
                for key, value in obj.items():
                    kind = _JSON_KINDS.get(type(value), "null")
                    first = kinds.get(key)
                    if kind != "null" and (first is None or first[0] == "null"):
                        kinds[key] = (kind, n)
                    elif kind != "null" and kind != first[0]:
                        return f"line {n}: {key!r} is a JSON {kind}, but a {first[0]} on line {first[1]}"
                    elif first is None:
                        kinds[key] = ("null", n)
                pos = end
                while pos < len(line) and line[pos].isspace():
                    pos += 1
    return "the file holds no rows" if not rows else None


def _table_stream(f: InputFile, columns: list[str] | None) -> Iterator[pa.Table]:
    if f.fmt == "parquet":
        pf = pq.ParquetFile(f.path)
        for rb in pf.iter_batches(batch_size=_SLICE_ROWS, columns=columns):
            yield pa.Table.from_batches([rb])
        return
    if f.fmt == "jsonl":
        reader = pjson.open_json(f.path, read_options=pjson.ReadOptions(block_size=_BLOCK_BYTES))
    else:
        reader = pcsv.open_csv(
            f.path,
            read_options=pcsv.ReadOptions(block_size=_BLOCK_BYTES),
            parse_options=pcsv.ParseOptions(delimiter="\t" if f.fmt == "tsv" else ",", newlines_in_values=True),
            convert_options=pcsv.ConvertOptions(include_columns=columns, strings_can_be_null=False),
        )
    for rb in reader:
        yield pa.Table.from_batches([rb])


def _text_stream(f: InputFile) -> Iterator[list[str]]:
    # One document per line; "\n" only (not str.splitlines, which would also split on \x0b, \u2028 …).
    buf: list[str] = []
    with open(f.path, encoding="utf-8", newline="") as fh:
        for line in fh:
            buf.append(line[:-1].removesuffix("\r") if line.endswith("\n") else line)
            if len(buf) == _SLICE_ROWS:
                yield buf
                buf = []
    if buf:
        yield buf


def _normalize_ids(ids: pa.Array, f: InputFile) -> pa.Array:
    if pa.types.is_integer(ids.type):
        out = ids.cast(pa.int64())
    else:
        out = ids.cast(pa.string())
    if out.null_count:
        raise InputError(f"{f.path}: the id column has an empty value")
    return out


def iter_file(f: InputFile, text_column: str, id_column: str | None, start: int) -> Iterator[RowChunk]:
    """Rows of one file as RowChunks whose ids are the id column or the global row index.

    ``start`` is the global index of the file's first row. Raises InputError on an empty text.
    """
    pos = start
    if f.fmt == "text":
        for lines in _text_stream(f):
            yield RowChunk(pos, pa.array(range(pos, pos + len(lines)), pa.int64()), lines)
            pos += len(lines)
        return
    cols = [text_column] + ([id_column] if id_column else [])
    for table in _open_table_stream(f, cols):
        if table.num_rows == 0:
            continue
        text = table.column(text_column).combine_chunks()
        if not pa.types.is_string(text.type) and not pa.types.is_large_string(text.type):
            text = text.cast(pa.string())
        if text.null_count:
            bad = pc.index(pc.is_null(text), True).as_py()
            where = {"csv": "data row", "tsv": "data row", "jsonl": "line"}.get(f.fmt, "row")
            counted = ", header not counted" if f.fmt in ("csv", "tsv") else ""
            raise InputError(f"{f.path}: {where} {pos - start + bad + 1} (counting from 1{counted}) has no "
                             f"{text_column!r} value")
        if id_column:
            ids = _normalize_ids(table.column(id_column).combine_chunks(), f)
        else:
            ids = pa.array(range(pos, pos + table.num_rows), pa.int64())
        yield RowChunk(pos, ids, text.to_pylist())
        pos += table.num_rows


def read_chunks(
    files: list[InputFile], text_column: str, id_column: str | None, chunk_rows: int, shard_rows: int,
    skip_shards: frozenset[int] = frozenset(),
) -> Iterator[RowChunk]:
    """All rows of ``files`` in order, cut into chunks of at most ``chunk_rows`` that never cross a
    multiple of ``shard_rows``. Rows of shards in ``skip_shards`` are read but not yielded."""
    if chunk_rows < 1 or shard_rows < 1:
        raise ValueError(f"chunk_rows and shard_rows must be ≥ 1, got {chunk_rows} and {shard_rows}")
    pending: list[RowChunk] = []
    pending_rows = 0
    pos = 0

    def cut(limit: int) -> RowChunk:
        nonlocal pending, pending_rows
        ids = pa.concat_arrays([c.ids for c in pending]) if len(pending) > 1 else pending[0].ids
        texts = [t for c in pending for t in c.texts] if len(pending) > 1 else pending[0].texts
        head = RowChunk(pending[0].start, ids.slice(0, limit), texts[:limit])
        rest = len(texts) - limit
        pending = [RowChunk(head.end, ids.slice(limit), texts[limit:])] if rest else []
        pending_rows = rest
        return head

    def next_cut(first: int) -> int:
        shard, off = divmod(first, shard_rows)
        return shard * shard_rows + min(shard_rows, (off // chunk_rows + 1) * chunk_rows) - first

    for f in files:
        for chunk in iter_file(f, text_column, id_column, pos):
            pos = chunk.end
            pending.append(chunk)
            pending_rows += len(chunk.texts)
            while pending and pending_rows >= next_cut(pending[0].start):
                head = cut(next_cut(pending[0].start))
                if head.start // shard_rows not in skip_shards:
                    yield head
    while pending:
        head = cut(min(pending_rows, next_cut(pending[0].start)))
        if head.start // shard_rows not in skip_shards:
            yield head


def estimate_rows(files: list[InputFile]) -> int:
    """Row count for the progress bar: exact for Parquet and text, line count for JSONL/CSV
    (quoted newlines in CSV make it an over-estimate). Reads each file once, in 16 MiB blocks."""
    total = 0
    for f in files:
        if f.fmt == "parquet":
            total += pq.ParquetFile(f.path).metadata.num_rows
            continue
        lines, last = 0, b"\n"
        with open(f.path, "rb") as fh:
            while block := fh.read(16 << 20):
                lines += block.count(b"\n")
                last = block[-1:]
        lines += last != b"\n"
        total += max(lines - (f.fmt in ("csv", "tsv")), 0)
    return total


def input_bytes(files: list[InputFile]) -> int:
    return sum(os.path.getsize(f.path) for f in files)
