# Two commands set everything up on a fresh machine:
#   make demo   create .venv if absent, install gpt2 (with its train, eval, serve and inspect extras), and run it
#   make test   create .venv if absent, install gpt2 with its dev, train, eval, serve and inspect extras, Chromium
#               where it can (for the playground's browser tests), and run the tests
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean kernel browser

# torch is pinned first: here pip takes a local CPU build in seconds, where an unpinned
# torch would pull a multi-GB CUDA build. Elsewhere, pass TORCH="..." for the build you want (README).
TORCH ?= torch==2.13.0

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[train,eval,serve,inspect,structured,export]"
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[dev,train,eval,serve,inspect,structured,export,cluster]"
	touch $@ $(VENV)/.installed

# The decode kernel (src/gpt2/generation/kernels.py): compiled once for each Python, torch, compiler and
# CPU (about 50 s on 2 cores), here at set-up rather than in the first generation; and the tokenizer's
# (src/gpt2/tokenizer/native.py: its first pass in C, under a second), rather than in the first encode.
kernel: $(VENV)/.installed
	@$(BIN)/python -m gpt2.generation.kernels
	@$(BIN)/python -m gpt2.tokenizer.native

# MODEL: a released name (downloaded once) or a local directory of weights.
MODEL ?= gpt2
PROMPT ?= Alan Turing theorized that computers would one day become

demo: $(VENV)/.installed kernel
	$(BIN)/gpt2 tokenize "$(PROMPT)"
	$(BIN)/python scripts/demo.py --model "$(MODEL)" "$(PROMPT)"

# The playground's tests drive Chromium through Playwright, whose own download needs a network:
# they use the system's Chromium, installed here where root and apt-get are; else one line says how.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; }; } || \
	echo "make test: no Chromium for the browser tests: sudo apt-get install chromium (or: $(BIN)/python -m playwright install chromium)"

# Two workers (pytest-xdist), each given whole test files, so a file's shared model or server
# starts once, in the order tests/conftest.py gives them (the slowest first: xdist would reorder them
# by their number of tests); torch runs one thread in each. The 20 slowest tests are listed.
# Python keeps its bytecode (__pycache__) even where the environment says not to
# (PYTHONDONTWRITEBYTECODE, set on some CI images): the tests start many Python processes that
# import gpt2, and each would compile its source anew (0.6-0.8 s).
test: $(VENV)/.installed-dev kernel browser lint
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=20

# ruff keeps the house's habits (pyproject.toml's [tool.ruff]): the tests run only where both pass.
# `$(BIN)/ruff format .` and `$(BIN)/ruff check --fix .` make them pass.
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(VENV)/.installed-dev kernel
	$(BIN)/python benchmarks/tokenizer.py
	$(BIN)/python benchmarks/load_memory.py
	$(BIN)/python benchmarks/generate.py
	$(BIN)/python benchmarks/serve.py
	$(BIN)/python benchmarks/load.py
	$(BIN)/python benchmarks/lowbit.py
	$(BIN)/python benchmarks/prepare.py
	$(BIN)/python benchmarks/train.py
	$(BIN)/python benchmarks/evaluate.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
