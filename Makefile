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

# MODEL: a released name (downloaded once) or a local directory of weights.
MODEL ?= gpt2
PROMPT ?= Alan Turing theorized that computers would one day become

demo: $(VENV)/.installed
	$(BIN)/gpt2 tokenize "$(PROMPT)"
	@$(BIN)/gpt2 generate "$(PROMPT)" --model "$(MODEL)" --max-new-tokens 40 --temperature 0 || { \
	  echo "(the weights of '$(MODEL)' cannot be had here, so the same pipeline runs on random weights;"; \
	  echo " for real text, run with a network or pass MODEL=path/to/weights)"; \
	  $(BIN)/python -c "from gpt2 import GPT2, GPT2Config; GPT2(GPT2Config(n_layer=4, n_head=4, n_embd=256)).save_pretrained('.demo-random-gpt2')" && \
	  $(BIN)/gpt2 generate "$(PROMPT)" --model .demo-random-gpt2 --max-new-tokens 40 --seed 0; }

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/tokenizer.py
	$(BIN)/python benchmarks/load_memory.py
	$(BIN)/python benchmarks/generate.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis .demo-random-gpt2
