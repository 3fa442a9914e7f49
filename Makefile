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
# pytest's xdist workers: one more than CI's 2 cores, since many tests wait (docs/contributing.md)
WORKERS ?= 3

.PHONY: setup lab test lint bench clean gpu-check

# torch comes first, through pip: the torch already installed then satisfies the project's range. The rest goes
# through uv, about four times faster than pip (downloads in parallel, bytecode compiled on every core). uv does
# not read pip's configuration (a private index, say): where uv cannot be installed or fails, pip installs it.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	{ $(BIN)/python -m pip install --quiet uv && \
	  $(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode -e ".[test]"; } || \
	  $(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

setup: $(VENV)/.installed

lab: setup
	$(BIN)/course lab

lint: setup
	$(BIN)/ruff check course grader tests benchmarks

test: lint
	$(BIN)/course info
	$(BIN)/python -m pytest -n $(WORKERS)

bench: setup
	status=0; for script in benchmarks/*.py; do echo "== $$script"; $(BIN)/python $$script || status=1; done; exit $$status

# On a GPU machine, from the tree with the machine's own Python (torch with CUDA already installed): every notebook,
# lab and the grader on the GPUs present, and measured vs modelled timings, into one file under benchmarks/results/.
# WHEELS=folder installs nbval, ipykernel and ipywidgets from wheels there first (no network needed).
gpu-check:
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) benchmarks/gpu_course_check.py $(if $(WHEELS),--wheels $(WHEELS))

clean:
	rm -rf $(VENV) *.egg-info
