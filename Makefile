# Every target creates the local virtual environment first, so both commands work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
# torch is installed on its own, before the package: override for another build, e.g.
#   make test TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124"
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# the default suite runs on every core (at most 4 workers): `make test PYTEST_XDIST=` runs it in one process
PYTEST_XDIST ?= -n auto --maxprocesses 4 --dist worksteal

.PHONY: all venv demo test test-all bench figures guide clean

# `make bench BENCH="jacobian hessian"` runs a subset of benchmarks/

all: test

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install "$(TORCH_SPEC)"
	$(PY) -m pip install -e ".[test,jax,ipopt]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m asd demo

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not gpu" $(PYTEST_XDIST) $(PYTEST_ARGS)

test-all: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

# Peers live in the benchmark environment only: casadi beside asd, jax + asdex in their own venv.
BENCH_VENV ?= .venv-bench-jax
$(VENV)/.bench: $(STAMP)
	$(PY) -m pip install -e ".[bench,ipopt]"
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install jax jaxlib asdex
	touch $(VENV)/.bench

bench: $(VENV)/.bench
	ASD_JAX_PYTHON=$(BENCH_VENV)/bin/python $(PY) -m asd bench $(BENCH)

figures: $(STAMP)
	$(PY) -m asd figures

guide: $(STAMP)
	$(PY) -m asd guide

clean:
	rm -rf $(VENV) $(BENCH_VENV) build *.egg-info
