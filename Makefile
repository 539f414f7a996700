# Two commands on a fresh machine with only Python 3.11: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
# The CPU wheel of torch (constraints-cpu.txt pins it). Machines that keep local wheels in
# /opt/wheels (pip's find-links there) use them; elsewhere PyTorch's CPU index serves the wheel.
TORCH_INDEX ?= $(if $(wildcard /opt/wheels/torch-*+cpu-*.whl),,--extra-index-url https://download.pytorch.org/whl/cpu)
PIP_TORCH := -c constraints-cpu.txt $(TORCH_INDEX)

.PHONY: test demo bench bench-all install clean

$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (or: make PYTHON=python3)"; exit 1; }
	@echo "[make] creating the virtual environment $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	@echo "[make] installing torch (CPU wheel, ~200 MB), torchdiffeq, scipy, matplotlib, tqdm,"
	@echo "[make] pytest and torchgeo_int itself (editable) into $(VENV): about a minute"
	$(PY) -m pip install $(PIP_TORCH) -e '.[dev]'
	@echo "[make] installed; next runs skip this step (delete $(VENV) to reinstall)"
	@touch $@

install: $(VENV)/.installed

# One OpenMP thread unless the caller says otherwise: small tensors gain nothing from threads,
# and on a shared machine their spin-waits cost 10x and more (see the README, "Threads").
export OMP_NUM_THREADS ?= 1

# Test worker processes (pytest-xdist): one per core of the 2-core CI machine; TEST_WORKERS=0
# runs serially in one process.
TEST_WORKERS ?= 2

test: $(VENV)/.installed
	@echo "[make] running the test suite on $(TEST_WORKERS) worker processes (a few minutes on 2 CPU cores)"
	$(PY) -m pytest -n $(TEST_WORKERS)

demo: $(VENV)/.installed
	@echo "[make] running experiments/demo.py (about 2 minutes): integrators, then HNN training"
	$(PY) experiments/demo.py

bench: $(VENV)/.installed
	@echo "[make] running the benchmarks (under 10 minutes)"
	@$(PY) -m pip install -q $(PIP_TORCH) -e '.[bench]' || echo "numba not installed: the limits benchmark skips its numba rows"
	$(PY) -m experiments.bench

# the benchmarks and the work-precision study (about 17 minutes)
bench-all: $(VENV)/.installed
	@$(PY) -m pip install -q $(PIP_TORCH) -e '.[bench]' || echo "numba not installed: the limits benchmark skips its numba rows"
	$(PY) -m experiments.bench --all

clean:
	rm -rf $(VENV) results .pytest_cache
