# Two commands set everything up on a fresh machine:
#   make demo   create .venv if absent, install gpt2, and run it
#   make test   create .venv if absent, install gpt2 with its dev extra, and run the tests
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test bench clean

# torch is pinned first: here pip takes a local CPU build in seconds, where an unpinned
# torch would pull a multi-GB CUDA build. Elsewhere, pick a build at pytorch.org first.
TORCH ?= torch==2.13.0

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH)"

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/gpt2 tokenize "Hello!! I'm Andrej Karpathy. It's 2022. w00t :D 🤗"
	$(BIN)/gpt2 tokenize --decode 15496 3228 314 1101 10948 73 509 5117 10036 13 632 338 33160 13 266 405 83 1058 35 12520 97 245

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/tokenizer.py
	$(BIN)/python benchmarks/load_memory.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
