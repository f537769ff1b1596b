"""The STS Benchmark's files (the SemEval/STSb distribution: tab-separated, no quoting)."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


def read_sts(directory: Path, split: str) -> tuple[list[str], list[str], np.ndarray]:
    """``directory/sts-{split}.csv`` → (sentences 1, sentences 2, gold scores float64 [N]).
    Score, s1, s2 are columns 5-7 (1-based); some rows carry extra columns after them."""
    s1, s2, gold = [], [], []
    with open(directory / f"sts-{split}.csv", encoding="utf-8") as f:
        for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            gold.append(float(row[4]))
            s1.append(row[5])
            s2.append(row[6])
    return s1, s2, np.asarray(gold)
