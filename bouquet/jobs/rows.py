"""Documents and ids out of one slice of an input file, and the line to fix when a row is bad.

pyarrow reports a bad value by its index inside a block, or not at all (a JSON object where a
string was expected, invalid UTF-8 in a CSV cell), and a job over millions of rows must name the
file and line instead. The normal path stays in Arrow (one UTF-8 validation pass per slice); only
when a slice is bad is the file read again in Python, to turn the row's index into its line.

Accepted values: documents are strings (Parquet binary columns too, when they hold UTF-8); ids are
integers (kept as int64) or strings (kept as written). CSV/TSV cells are all strings: the readers
ask pyarrow for bytes, never for inferred numbers, so ``0123`` stays "0123".

What this module does not own: opening and streaming the files (reader.py).
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

import pyarrow as pa
import pyarrow.compute as pc

Format = Literal["jsonl", "csv", "tsv", "parquet", "text"]


@dataclass(frozen=True)
class InputFile:
    """One input file and how to read it (bouquet/jobs/reader.py finds them)."""

    path: Path
    fmt: Format


class InputError(ValueError):
    """The input is missing, of an unknown type, lacks a required column, or holds a bad row; the
    message names the file (and the line, for a row)."""


_JSON_KINDS = {str: "string", int: "number", float: "number", bool: "boolean", dict: "object", list: "array"}


def jsonl_objects(path: Path) -> Iterator[tuple[int, object]]:
    """(line, value) for every JSON value of a JSONL file, lines counted from 1; several values on
    one line are taken, as pyarrow takes them. A line that is not JSON yields (line, JSONDecodeError)
    and ends the iteration. Bytes that are not UTF-8 are replaced (this only locates rows)."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8-sig", errors="replace") as fh:  # a BOM is fine for pyarrow too
        for n, line in enumerate(fh, 1):
            pos, line = 0, line.strip()
            while pos < len(line):
                try:
                    obj, pos = decoder.raw_decode(line, pos)
                except json.JSONDecodeError as e:
                    yield n, e
                    return
                yield n, obj
                while pos < len(line) and line[pos].isspace():
                    pos += 1


def first_bad_jsonl_line(f: InputFile) -> str | None:
    """Where a JSONL file goes wrong: a line that is not a JSON object, or a field whose JSON type
    differs from its type on an earlier line (pyarrow's row numbers count from 0 within a block, and
    its parse errors do not say what is wrong). None if no line is."""
    kinds: dict[str, tuple[str, int]] = {}  # field → (its first non-null JSON type, that line)
    rows = 0
    for n, obj in jsonl_objects(f.path):
        if isinstance(obj, json.JSONDecodeError):
            return f"line {n} is not valid JSON ({obj.msg}, column {obj.colno})"
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
    return "the file holds no rows" if not rows else None


def _csv_records(f: InputFile) -> Iterator[tuple[int, list[str]]]:
    """(first line, fields) of every non-empty CSV/TSV record, header included (Python's csv module
    follows the same quoting as pyarrow's reader, quoted newlines included)."""
    with open(f.path, encoding="utf-8-sig", errors="replace", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t" if f.fmt == "tsv" else ",")
        line = 1
        for record in reader:
            if record:  # pyarrow skips empty lines
                yield line, record
            line = reader.line_num + 1


def where(f: InputFile, row: int) -> str:
    """The place of data row ``row`` (0-based, from the file's first row) as a user finds it:
    'line L' (text, JSONL, CSV/TSV: the record's first line) or 'row R' (Parquet), counted from 1."""
    if f.fmt == "text":
        return f"line {row + 1}"
    if f.fmt == "jsonl":
        for i, (line, _) in enumerate(jsonl_objects(f.path)):
            if i == row:
                return f"line {line}"
    elif f.fmt in ("csv", "tsv"):
        for i, (line, _) in enumerate(_csv_records(f)):
            if i == row + 1:  # record 0 is the header
                return f"line {line} (data row {row + 1})"
    return f"row {row + 1}"


def bad_csv_record(f: InputFile) -> str | None:
    """'line L (data row R): N fields where the header has M' for the first record of the wrong
    width, else None."""
    width = None
    for i, (line, record) in enumerate(_csv_records(f)):
        if width is None:
            width = len(record)
        elif len(record) != width:
            return f"line {line} (data row {i}): {len(record)} fields where the header has {width}"
    return None


def unclosed_quote(f: InputFile) -> str | None:
    """'line L (data row R): a quoted value is not closed ...' when a CSV/TSV file ends inside a
    quoted value, else None. pyarrow's reader takes such a value to run to the end of the file,
    every later record included, without an error; Python's csv module in strict mode refuses it
    ("unexpected end of data"). Other quirks it refuses but pyarrow reads are not reported here."""
    with open(f.path, encoding="utf-8-sig", errors="replace", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t" if f.fmt == "tsv" else ",", strict=True)
        line, records = 1, 0
        try:
            for record in reader:
                records += bool(record)
                line = reader.line_num + 1
        except csv.Error as e:
            if "unexpected end of data" not in str(e):
                return None
            return (f"line {line} (data row {records}): a quoted value is not closed before the end of the file "
                    "(its opening quote would swallow every later row)")
    return None


def bad_utf8_line(path: Path) -> str:
    """'line L: not valid UTF-8 (byte 0xNN at column C)' for the first such line of a file."""
    with open(path, "rb") as fh:
        for n, raw in enumerate(fh, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return f"line {n}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
    return "not valid UTF-8"


def _kind(f: InputFile, t: pa.DataType) -> str:
    if f.fmt != "jsonl":
        return f"holds {t} values"
    if pa.types.is_struct(t) or pa.types.is_map(t):
        return "is a JSON object"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "is a JSON array"
    return "is a JSON boolean" if pa.types.is_boolean(t) else "is a JSON number"


def _utf8(col: pa.Array, f: InputFile, first_row: int, name: str) -> pa.Array:
    """A string/binary column as a validated string array; InputError at the first value that is
    not UTF-8 (pyarrow does not check JSON strings, and names no row for CSV or Parquet)."""
    try:
        if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
            return col.cast(pa.string())
        col.validate(full=True)
        return col.cast(pa.string()) if pa.types.is_large_string(col.type) else col
    except pa.ArrowInvalid:
        pass
    for i, raw in enumerate(col.cast(pa.large_binary()).to_pylist()):
        try:
            (raw or b"").decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{f.path}: {where(f, first_row + i)}: {name!r} is not valid UTF-8 "
                             f"(byte 0x{raw[e.start]:02x} at position {e.start + 1} of the value)") from None
    raise InputError(f"{f.path}: column {name!r} cannot be read as UTF-8 text")  # unreachable in practice


def _stringlike(t: pa.DataType) -> bool:
    return any(check(t) for check in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                      pa.types.is_large_binary))


def _first_valid(col: pa.Array) -> int:
    return int(pc.index(pc.is_valid(col), True).as_py())


def text_values(col: pa.Array | pa.ChunkedArray, f: InputFile, first_row: int, name: str) -> list[str]:
    """The documents of one slice ([n] string or binary) as Python strings.

    ``first_row`` is the slice's first row within the file (0-based). Raises InputError naming the
    file and line of the first row without a text (null), with a value that is not a string, or
    with bytes that are not UTF-8."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if col.null_count:
        bad = int(pc.index(pc.is_null(col), True).as_py())
        raise InputError(f"{f.path}: {where(f, first_row + bad)}: no {name!r} value")
    if not _stringlike(col.type):
        raise InputError(f"{f.path}: {where(f, first_row + _first_valid(col))}: {name!r} {_kind(f, col.type)}; "
                         "documents must be strings")
    return _utf8(col, f, first_row, name).to_pylist()


def id_values(col: pa.Array | pa.ChunkedArray, f: InputFile, first_row: int, name: str) -> pa.Array:
    """The ids of one slice: [n] int64 for integer columns, else [n] string, as written.

    Raises InputError naming the file and line of the first empty id (null, or an empty CSV cell)
    or of a value that is neither an integer nor a string (a JSON 1.5 would come back as "1.5" at
    best, not as written: store such ids as strings)."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if col.null_count:
        bad = int(pc.index(pc.is_null(col), True).as_py())
        raise InputError(f"{f.path}: {where(f, first_row + bad)}: no {name!r} value")
    if pa.types.is_integer(col.type):
        try:
            return col.cast(pa.int64())
        except pa.ArrowInvalid:  # uint64 beyond int64
            raise InputError(f"{f.path}: column {name!r} holds integers beyond int64; store them as strings") from None
    if not _stringlike(col.type):
        raise InputError(f"{f.path}: {where(f, first_row + _first_valid(col))}: {name!r} {_kind(f, col.type)}; "
                         "ids must be integers or strings")
    ids = _utf8(col, f, first_row, name)
    if f.fmt in ("csv", "tsv"):
        empty = pc.equal(pc.utf8_length(ids), 0)
        if pc.any(empty).as_py():
            raise InputError(f"{f.path}: {where(f, first_row + int(pc.index(empty, True).as_py()))}: empty {name!r}")
    return ids
