"""What the docs and the help texts name exists as named: every `--quantization` choice the code takes
(bouquet.config.QUANTIZATIONS) in `bouquet serve --help`, `bouquet embed --help`, `bouquet server --help`
the first paragraph of docs/quantization.md and README.md; every source file a doc names by its path."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bouquet.config import QUANTIZATIONS

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", ["serve", "embed", "server"])
def test_help_names_every_quantization(command: str) -> None:
    done = subprocess.run([sys.executable, "-m", "bouquet", command, "--help"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "400"})
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if "--quantization" in x)
    assert " | ".join(QUANTIZATIONS) in line, line


def test_quantization_doc_names_every_choice() -> None:
    first = (REPO / "docs" / "quantization.md").read_text().split("\n\n")[1]
    assert f"--quantization {'|'.join(QUANTIZATIONS)}" in first, first
    readme = (REPO / "README.md").read_text()
    assert all(f"--quantization {q}" in readme for q in QUANTIZATIONS if q != "none")  # the quick start's reader


DOCS = ["README.md", "bench/README.md", "tests/README.md", *(f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md"))
                                                             if p.name != "decisions.md")]  # decisions.md: a dated log


@pytest.mark.parametrize("doc", DOCS)
def test_source_files_a_doc_names_exist(doc: str) -> None:
    """A path such as `bouquet/engine/linear/cpu.py` in a doc (decisions.md aside: its entries name files as they
    were) is a file of the tree; a file moved without its docs sends the reader nowhere."""
    import re

    text = (REPO / doc).read_text()
    named = set(re.findall(r"`((?:bouquet|tests|bench)/[\w/.]+\.(?:py|proto|md))", text))
    missing = sorted(p for p in named if not (REPO / p).exists())
    assert not missing, f"{doc} names files that do not exist: {missing}"
