"""Streaming readers for batch jobs: JSONL, CSV/TSV, Parquet and plain text, via pyarrow.

Every reader yields small Arrow slices, so memory stays bounded by a few blocks whatever the file
size. ``read_chunks`` turns the files of one input into one global row sequence cut into chunks
that never straddle a shard boundary (shard ``s`` = global rows ``[s*S, (s+1)*S)``), which is what
makes output shards deterministic and resumable.

What this module does not own: tokenization, the embedding pipeline, output files.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq

from bouquet.jobs.rows import (Format, InputError, InputFile, bad_csv_record, bad_utf8_line, first_bad_jsonl_line,
                               id_values, text_values, unclosed_quote)

SUFFIXES: dict[str, Format] = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
    ".csv": "csv", ".tsv": "tsv",
    ".parquet": "parquet", ".pq": "parquet",
    ".txt": "text", ".text": "text",
}
_BLOCK_BYTES = 1 << 20  # pyarrow streaming block size: bounds memory per reader
_SLICE_ROWS = 4096  # rows per slice from Parquet and text files


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
    """Column names, read from the first block only. Raises InputError for a file without rows
    (as for an empty JSONL file), whose columns pyarrow does not report."""
    if f.fmt == "text":
        return []
    if f.fmt == "parquet":
        return pq.ParquetFile(f.path).schema_arrow.names
    first = next(iter(_open_table_stream(f, None)), None)
    if first is None:  # a CSV/TSV header without rows: pyarrow reads no block, so no columns either
        raise InputError(f"{f.path}: cannot be read as {f.fmt.upper()}: the file holds no rows")
    return first.column_names


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
    JSONL, the first line that is not a JSON object or whose values change type; for CSV/TSV the
    first record of the wrong width) when pyarrow cannot read it."""
    try:
        yield from _table_stream(f, columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        locate = {"jsonl": first_bad_jsonl_line, "csv": bad_csv_record, "tsv": bad_csv_record}.get(f.fmt)
        raise InputError(f"{f.path}: cannot be read as {f.fmt.upper()}: {(locate and locate(f)) or e}") from None


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
            # Bytes, never inferred types: pyarrow would read `0123` as 123 and abort at the first
            # `hello` after 200,000 numbers (its types come from the first block).
            convert_options=pcsv.ConvertOptions(include_columns=columns, strings_can_be_null=False,
                                                column_types={c: pa.binary() for c in columns or ()}),
        )
    for rb in reader:
        yield pa.Table.from_batches([rb])


def _text_stream(f: InputFile) -> Iterator[list[str]]:
    # One document per line; "\n" only (not str.splitlines, which would also split on \x0b, \u2028 …).
    buf: list[str] = []
    try:
        with open(f.path, encoding="utf-8", newline="") as fh:
            for line in fh:
                buf.append(line[:-1].removesuffix("\r") if line.endswith("\n") else line)
                if len(buf) == _SLICE_ROWS:
                    yield buf
                    buf = []
    except UnicodeDecodeError:  # decoded in blocks: its position is not a line, so look for it
        raise InputError(f"{f.path}: {bad_utf8_line(f.path)}") from None
    if buf:
        yield buf


def iter_file(f: InputFile, text_column: str, id_column: str | None, start: int) -> Iterator[RowChunk]:
    """Rows of one file as RowChunks whose ids are the id column or the global row index.

    ``start`` is the global index of the file's first row. Raises InputError naming the file and
    line of the first bad row (rows.py: no text, a text that is not a string or not UTF-8, an id
    that is empty or neither integer nor string).
    """
    pos = start
    if f.fmt == "text":
        for lines in _text_stream(f):
            yield RowChunk(pos, pa.array(range(pos, pos + len(lines)), pa.int64()), lines)
            pos += len(lines)
        return
    cols = [text_column] + ([id_column] if id_column else [])
    tables = (t for t in _open_table_stream(f, cols) if t.num_rows)
    table = next(tables, None)
    while table is not None:
        following = next(tables, None)  # one slice ahead: the last one is checked before it is yielded
        texts = text_values(table.column(text_column), f, pos - start, text_column)
        if id_column:
            ids = id_values(table.column(id_column), f, pos - start, id_column)
        else:
            ids = pa.array(range(pos, pos + table.num_rows), pa.int64())
        if following is None and f.fmt in ("csv", "tsv"):
            _check_csv_end(f, [texts[-1], str(ids[-1].as_py())])
        yield RowChunk(pos, ids, texts)
        pos += table.num_rows
        table = following


def _check_csv_end(f: InputFile, last_values: list[str]) -> None:
    # A file that ends inside a quoted value has it run to the end (with the file's last line
    # break when there is one). Only then is the file parsed again, strictly, to tell.
    with open(f.path, "rb") as fh:
        fh.seek(max(0, f.path.stat().st_size - 1))
        ends_with_break = fh.read(1) in (b"\n", b"\r")
    if ends_with_break and not any("\n" in v or "\r" in v for v in last_values):
        return
    problem = unclosed_quote(f)
    if problem:
        raise InputError(f"{f.path}: {problem}")


def read_chunks(
    files: list[InputFile], text_column: str, id_column: str | None, chunk_rows: int, shard_rows: int,
    skip_shards: frozenset[int] = frozenset(), first_row: int = 0,
) -> Iterator[RowChunk]:
    """All rows of ``files`` in order, cut into chunks of at most ``chunk_rows`` that never cross a
    multiple of ``shard_rows``. Rows of shards in ``skip_shards`` are read but not yielded.
    ``first_row`` is the global index of the first file's first row (a Ray read task's file)."""
    if chunk_rows < 1 or shard_rows < 1:
        raise ValueError(f"chunk_rows and shard_rows must be ≥ 1, got {chunk_rows} and {shard_rows}")
    pending: list[RowChunk] = []
    pending_rows = 0
    pos = first_row

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
