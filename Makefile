# Two commands for a fresh machine:
#   make demo       -> creates .venv, installs the package alone, runs the main job on scikit-learn's bundled digits
#   make test       -> also installs the extras the tests use (dev, text, interop, eeg), runs the whole suite
#   make test-fast  -> the same without the tests marked slow (pytest -m "not slow")
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= runs/digits
# where pip's index serves torch's CUDA build (plain PyPI on Linux), e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

.PHONY: demo test test-fast install install-test lint clean

# the package and its required dependencies: all that `make demo` runs
$(VENV)/.installed-demo: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q -e .
	@touch $@

# + pytest and the oracles (dev), Hugging Face models (text), the real SAELens / sparsify (interop), EDF reading (eeg)
$(VENV)/.installed-test: $(VENV)/.installed-demo
	$(BIN)/pip install -q -e '.[dev,text,interop,eeg]'
	@touch $@

install: $(VENV)/.installed-demo

install-test: $(VENV)/.installed-test

demo: install
	$(BIN)/mlpinterp reproduce polynomial --dataset digits --seeds 3 --out $(OUT)

test: install-test
	$(BIN)/python -m pytest -q -n 2

test-fast: install-test
	$(BIN)/python -m pytest -q -n 2 -m "not slow"

lint: install-test
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) runs
