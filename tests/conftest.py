from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import BouquetProcess  # noqa: E402


@pytest.fixture(scope="session")
def minilm_server() -> Iterator[BouquetProcess]:
    """The embedded default model served on the CPU by the real `bouquet serve`."""
    srv = BouquetProcess()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def st_minilm():
    """sentence-transformers' own all-MiniLM-L6-v2 on the CPU: the reference."""
    from sentence_transformers import SentenceTransformer

    from bouquet.modelspec import resolve_model_path

    return SentenceTransformer(str(resolve_model_path(None)), device="cpu")
