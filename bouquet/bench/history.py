"""A run's figures as rows of bench/results/history.csv, and a run set against a baseline run.

history.csv has one row per figure: date, device, commit, benchmark, system, case, metric,
value, unit, source. ``bouquet bench --history FILE`` appends the run's rows; ``--baseline
results.json`` (an earlier run, e.g. from an old commit's checkout) adds a table of each row's
figure beside the baseline's and their ratio to results.md.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

COLUMNS = ("date", "device", "commit", "benchmark", "system", "case", "metric", "value", "unit", "source")
# the figures kept per row, and their units; latency rows keep p50 and p99
METRICS = {"p50": "ms", "p99": "ms", "emb_s": "emb/s", "req_s": "req/s", "pairs_s": "pairs/s"}


def _case(model: str, row: dict[str, Any]) -> str:
    return f"{model} {row.get('case', '')}".strip()


def history_rows(results: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """Rows of ``results`` (the dict results.json holds) in ``COLUMNS`` order, one per figure of
    ``METRICS`` each row has, plus each system's correctness check (min cosine vs transformers)."""
    meta = results["meta"]
    device = meta.get("gpu") or f"CPU {meta.get('cpu', '')}".strip()
    base = {"date": str(meta.get("date", ""))[:10], "device": device, "commit": meta.get("commit", "unknown"),
            "source": source}
    out = []
    for model, m in results["models"].items():
        for row in m["rows"]:
            for metric, unit in METRICS.items():
                if metric in row:
                    out.append({**base, "benchmark": row["bench"], "system": row["system"], "case": _case(model, row),
                                "metric": metric, "value": row[metric], "unit": unit})
        for system, cos in (m.get("checks") or {}).items():
            out.append({**base, "benchmark": "check", "system": system, "case": model, "metric": "min_cosine",
                        "value": cos, "unit": "1"})
    return out


# the CPU suite's figures per system (bench/cpu.py's record) and their units
CPU_METRICS = {"bulk_per_s": "sentences/s", "b1_p50_ms": "ms", "b1_p99_ms": "ms", "min_cos": "1", "spearman": "1"}


def cpu_history_rows(record: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """Rows of a CPU suite record (cpu-results.json) in ``COLUMNS`` order: one per system and
    figure of ``CPU_METRICS``; the case names the STSb split and its pair count."""
    base = {"date": str(record.get("date", ""))[:10], "device": f"CPU {record.get('cpu', '')}".strip(),
            "commit": record.get("commit", "unknown"), "benchmark": "cpu", "source": source,
            "case": f"STSb {record.get('split', '')} {record.get('pairs', '')} pairs"}
    return [{**base, "system": system, "metric": metric, "value": row[metric], "unit": unit}
            for system, row in record["systems"].items() for metric, unit in CPU_METRICS.items() if metric in row]


def append_history(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` to the CSV at ``path``, writing the header first when the file is new."""
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        if new:
            w.writeheader()
        w.writerows(rows)


def compare(results: dict[str, Any], baseline: dict[str, Any]) -> str:
    """Markdown: every (model, benchmark, case, system) present in both runs, its main figure (p50
    ms for latency rows, else emb/s, req/s or pairs/s) in each and new / baseline. Rows of one run
    only are left out; an empty string when nothing matches."""
    def main_figures(res: dict[str, Any]) -> dict[tuple[str, str, str, str], tuple[str, float]]:
        found = {}
        for model, m in res["models"].items():
            for row in m["rows"]:
                metric = next((k for k in ("emb_s", "pairs_s", "p50") if k in row), None)
                if metric is not None and row["bench"] != "5":
                    found[(model, row["bench"], row.get("case", ""), row["system"])] = (metric, float(row[metric]))
                elif "req_s" in row:
                    found[(model, row["bench"], row.get("case", ""), row["system"])] = ("req_s", float(row["req_s"]))
        return found

    new, old = main_figures(results), main_figures(baseline)
    keys = [k for k in new if k in old]
    if not keys:
        return ""
    lines = [f"## Against the baseline run (commit {baseline['meta'].get('commit', 'unknown')})", "",
             "| model | benchmark | case | system | metric | baseline | this run | this / baseline |", "|---|---|---|---|---|---|---|---|"]
    for k in keys:
        metric, a = old[k]
        b = new[k][1]
        ratio = f"{b / a:.3f}" if a else "–"
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {metric} | {a:,.2f} | {b:,.2f} | {ratio} |")
    return "\n".join(lines) + "\n"
