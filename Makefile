# Two commands for a fresh machine:
#   make demo   -> creates .venv, installs, runs the main job on scikit-learn's bundled digits
#   make test   -> creates .venv, installs, runs the test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= runs/digits

.PHONY: demo test install lint bench clean

$(BIN)/mlpinterp: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,text,interop,eeg]'
	@touch $@

install: $(BIN)/mlpinterp

demo: install
	$(BIN)/mlpinterp reproduce polynomial --dataset digits --seeds 3 --out $(OUT)

test: install
	$(BIN)/python -m pytest -q -n 2

lint: install
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) runs
