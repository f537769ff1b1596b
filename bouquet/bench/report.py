"""Benchmark results → JSON, a markdown table and PNG plots, every system side by side."""
from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

def titles(settings: dict[str, Any]) -> dict[str, str]:
    """Each benchmark's heading, with the sizes this run used (``meta["settings"]``; the defaults
    where a results file predates them)."""
    g = {"score_len": 512, "thr_batch": 100, "clients": 4, "mixed": (16, 512), **settings}
    return {
        "1": "Benchmark 1: batch-1 latency, pre-tokenized (p50 ms)",
        "2": f"Benchmark 2: scoring latency, {g['score_len']} tokens (p50 ms)",
        "3": f"Benchmark 3: throughput, batch {g['thr_batch']}, {g['clients']} clients (emb/s)",
        "3-mixed": f"Benchmark 3, mixed lengths {g['mixed'][0]}-{g['mixed'][1]} in arrival order, batch "
                   f"{g['thr_batch']} (emb/s)",
        "4": "Benchmark 4: text through the gateway, concurrent clients (p50 ms)",
        "5": "Benchmark 5: online queries, one short text per request, N client processes (req/s; p50 / p99 ms)",
        "rerank": "Rerank: one query against N documents per request, /v1/rerank (p50 / p99 ms, pairs/s)",
    }


def _cell(row: dict[str, Any]) -> str:
    gpu = row.get("gpu")
    clock = f" {gpu['sm_mhz']:.0f} MHz" if gpu else ""
    if "emb_s" in row:
        return f"{row['emb_s']:,.0f} ({100 * row['roofline_frac']:.0f}%){clock}"
    if row.get("bench") == "rerank":
        return f"{row['p50']:.2f} / {row['p99']:.2f}, {row['pairs_s']:,.0f} pairs/s"
    if row.get("bench") == "5":
        bad = sum(v for k, v in row.get("statuses", {}).items() if k != "200") + len(row.get("errors") or [])
        if not row.get("n"):  # nothing answered in the window: the row holds only its errors (loadgen.summarize)
            return f"no answer in the window ({bad} failed: {'; '.join(map(str, row.get('errors') or []))[:200]}){clock}"
        return f"{row['req_s']:,.0f} req/s, {row['p50']:.2f} / {row['p99']:.2f}{f' ({bad} failed)' if bad else ''}{clock}"
    caps = row.get("captures_in_window")
    caught = f", {caps} graph capture{'s' if caps != 1 else ''} in the window" if caps and caps > 0 else ""
    return f"{row['p50']:.2f} / {row['p99']:.2f} ({100 * row['roofline_frac']:.0f}%){clock}{caught}"


def markdown(results: dict[str, Any]) -> str:
    """One table per (model, benchmark): rows = cases, columns = systems."""
    meta = results["meta"]
    heads = titles(meta.get("settings", {}))
    lines = [f"# bouquet bench — {meta.get('gpu') or meta.get('cpu')}", "",
             f"commit `{meta.get('commit')}`, torch {meta.get('torch')}, transformers {meta.get('transformers')}, "
             f"matmul ceiling {meta['matmul_tflops']:.3g} TFLOP/s, {meta.get('date')}", "",
             "Latency cells: p50 / p99 ms (fraction of the roofline floor reached); throughput cells: emb/s "
             "(fraction of the roofline ceiling). Roofline = model FLOPs / measured matmul rate. On a GPU, "
             "each cell ends with the SM clock sampled halfway through the case.", ""]
    for model, res in results["models"].items():
        rows = res["rows"]
        lines.append(f"## {model}")
        lines.append("")
        if res.get("checks"):
            checks = ", ".join(f"{k} {v:.5f}" for k, v in res["checks"].items())
            lines += [f"Correctness (min cosine vs transformers): {checks}", ""]
        if res.get("errors"):
            lines += ["Errors: " + "; ".join(f"{k}: {v[:300]}" for k, v in res["errors"].items()), ""]
        if res.get("graphs"):
            g = res["graphs"]
            lines += [f"Graphs: graph == eager on {g['buckets_checked']} buckets, worst cosine {g['worst_cosine']:.6f}, "
                      f"max |diff| {g['max_abs_diff']:.2e}; {g['captured']} captured in {g['capture_s']:.2f} s; "
                      f"peak GPU memory {g['peak_mem_gib']:.2f} GiB", ""]
        by_bench: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            by_bench[r["bench"]].append(r)
        for bench, brs in by_bench.items():
            systems = list(dict.fromkeys(r["system"] for r in brs))
            cases = list(dict.fromkeys(r["case"] for r in brs))
            floor_col = "floor ms" if "emb_s" not in brs[0] else "ceiling emb/s"
            lines.append(f"### {heads.get(bench, bench)}")
            lines.append("")
            lines.append("| case | " + " | ".join(systems) + f" | {floor_col} |")
            lines.append("|---" * (len(systems) + 2) + "|")
            for case in cases:
                cells = {r["system"]: r for r in brs if r["case"] == case}
                any_r = next(iter(cells.values()))
                floor = any_r.get("floor_ms", any_r.get("ceiling_emb_s"))
                lines.append(f"| {case} | " + " | ".join(_cell(cells[s]) if s in cells else "–" for s in systems)
                             + (f" | {floor:,.3f} |" if floor is not None else " | – |"))
            lines.append("")
    return "\n".join(lines)


def plot(results: dict[str, Any], out: Path) -> list[Path]:
    """One PNG per model: a panel per benchmark, grouped bars per case, one colour per system."""
    import matplotlib

    heads = titles(results["meta"].get("settings", {}))

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for model, res in results["models"].items():
        by_bench: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in res["rows"]:
            by_bench[r["bench"]].append(r)
        if not by_bench:
            continue
        fig, axes = plt.subplots(1, len(by_bench), figsize=(5 * len(by_bench), 4), squeeze=False)
        for ax, (bench, brs) in zip(axes[0], by_bench.items()):
            systems = list(dict.fromkeys(r["system"] for r in brs))
            cases = list(dict.fromkeys(r["case"] for r in brs))
            width = 0.8 / len(systems)
            key = "emb_s" if "emb_s" in brs[0] else "req_s" if bench == "5" else "p50"
            for i, sysname in enumerate(systems):
                vals = [next((r[key] for r in brs if r["case"] == c and r["system"] == sysname), 0.0) for c in cases]
                ax.bar([j + i * width for j in range(len(cases))], vals, width, label=sysname)
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases, rotation=20, fontsize=8)
            ax.set_yscale("log")
            ax.set_ylabel({"emb_s": "embeddings/s", "req_s": "requests/s"}.get(key, "p50 ms"))
            ax.set_title(heads.get(bench, bench), fontsize=8)
            ax.legend(fontsize=7)
        fig.suptitle(f"{model} — {results['meta'].get('gpu') or results['meta'].get('cpu')}")
        fig.tight_layout()
        path = out / f"bench-{model}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        files.append(path)
    return files


def write_all(results: dict[str, Any], out: Path, plots: bool = True) -> list[Path]:
    """results.json, results.md and (``plots``) the plots under ``out``; returns the paths. Without
    matplotlib (the ``bench`` extra) the plots are skipped with a warning: the numbers are all in
    the files."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(markdown(results))
    if not plots:
        return [out / "results.json", out / "results.md"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log.warning("bench: plots skipped, matplotlib is not installed (pip install 'bouquet[bench]')")
        return [out / "results.json", out / "results.md"]
    return [out / "results.json", out / "results.md", *plot(results, out)]
