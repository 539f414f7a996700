# Two commands on a fresh machine with only Python 3.11: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
# The CPU wheel of torch (constraints-cpu.txt pins it). Machines that keep local wheels in
# /opt/wheels (pip's find-links there) use them; elsewhere PyTorch's CPU index serves the wheel.
TORCH_INDEX ?= $(if $(wildcard /opt/wheels/torch-*+cpu-*.whl),,--extra-index-url https://download.pytorch.org/whl/cpu)
PIP_TORCH := -c constraints-cpu.txt $(TORCH_INDEX)

.PHONY: test demo bench install clean

$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH (or: make PYTHON=python3)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(PIP_TORCH) -e '.[dev]'
	@touch $@

install: $(VENV)/.installed

test: $(VENV)/.installed
	$(PY) -m pytest

demo: $(VENV)/.installed
	$(PY) experiments/demo.py

bench: $(VENV)/.installed
	$(PY) -m experiments.bench

clean:
	rm -rf $(VENV) results .pytest_cache
