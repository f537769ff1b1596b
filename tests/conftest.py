"""Fixtures shared by tests/unit, tests/integration and tests/gpu (the layout: tests/README.md)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

# `from helpers import ...` and `from reliability import ...` work from every folder below.
sys.path.insert(0, str(Path(__file__).parent))

from helpers import BouquetProcess  # noqa: E402

GPU_DIR = Path(__file__).parent / "gpu"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/gpu is a GPU test (`make test-gpu` selects them with -m gpu)."""
    for item in items:
        if GPU_DIR in Path(item.path).parents:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session", autouse=True)
def torch_threads_per_worker() -> None:
    """Under pytest-xdist, torch in this process (engines and references built in tests) gets the
    cores divided by the workers: two workers each running an OpenMP team as wide as the machine
    leave every team waiting on the other's threads at each op's barrier (the STSb fp8 test took
    90 s beside another worker, 26 s alone). Servers the tests start keep their own setting."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture(scope="session", autouse=True)
def fp32_cpu_auto() -> Iterator[None]:
    """The references (transformers, sentence-transformers) run in fp32, and most comparisons are
    tighter than bf16's rounding: tests resolve the CPU's ``--dtype auto`` to fp32 whatever the CI
    machine's CPU has (on one with AVX512-BF16 or AMX it would be bf16). A test that passes a
    dtype gets it; tests/test_cpu_path.py covers ``auto`` itself."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BOUQUET_DTYPE", "float32")  # `bouquet serve` children, unless given --dtype
        mp.setattr("bouquet.engine.runtime.engine.cpu_flags", lambda: frozenset())  # engines built in this process
        yield


@pytest.fixture(scope="session")
def minilm_server() -> Iterator[BouquetProcess]:
    """The embedded default model served on the CPU by the real `bouquet serve`."""
    srv = BouquetProcess()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def st_sts_test(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, "np.ndarray"]:
    """sentence-transformers' all-MiniLM-L6-v2 vectors ([384] float32, unnormalized: its Normalize
    module is in the pipeline, so they are unit length) of every distinct sentence of the STSb test
    split, by sentence: the reference of tests in several files, computed once per test run (2,552
    sentences, ~15 s on one core) and shared by the pytest-xdist workers through a file."""
    import numpy as np
    from filelock import FileLock

    from helpers import read_sts

    s1, s2, _ = read_sts("test")
    uniq = list(dict.fromkeys(s1 + s2))
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this run's folder, above each worker's own
    path = root / "st-minilm-sts-test.npy"
    with FileLock(f"{path}.lock"):
        if not path.exists():
            vecs = request.getfixturevalue("st_minilm").encode(uniq, batch_size=128, convert_to_numpy=True)
            np.save(root / "st-minilm-sts-test.part.npy", vecs)
            (root / "st-minilm-sts-test.part.npy").rename(path)
    return dict(zip(uniq, np.load(path)))


@pytest.fixture(scope="session")
def st_minilm():
    """sentence-transformers' own all-MiniLM-L6-v2 on the CPU: the reference."""
    from sentence_transformers import SentenceTransformer

    from bouquet.modelspec import resolve_model_path

    return SentenceTransformer(str(resolve_model_path(None)), device="cpu")
