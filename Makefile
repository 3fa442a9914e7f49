# Two commands for a fresh machine (see README.md):
#   make lab    set up .venv once, then open the course in JupyterLab
#   make test   set up .venv once, then lint and run every test and notebook
PYTHON ?= python3
VENV ?= .venv
# The CPU build of torch 2.13.0 on machines without GPUs; pip picks the CUDA build where it is the default.
# Unquoted below on purpose: TORCH="torch==2.13.0 --index-url URL" passes pip two words. A new TORCH needs
# `make clean` first: an existing .venv is kept as it is.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: setup lab test lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

setup: $(VENV)/.installed

lab: setup
	$(BIN)/course lab

lint: setup
	$(BIN)/ruff check course grader tests benchmarks

test: lint
	$(BIN)/course info
	$(BIN)/python -m pytest -n 2

bench: setup
	status=0; for script in benchmarks/*.py; do echo "== $$script"; $(BIN)/python $$script || status=1; done; exit $$status

clean:
	rm -rf $(VENV) *.egg-info
