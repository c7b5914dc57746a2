# Iris Desktop. Two commands matter: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: run test install install-dev lint bench screenshots dist clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e .
	touch $@

$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[dev]'
	touch $@ $(STAMP)

install: $(STAMP)
install-dev: $(DEV_STAMP)

## make run: create .venv, install, and start the desktop app on the bundled model
run: $(STAMP)
	$(BIN)/iris-desktop

## make test: create .venv, install with dev extras, run the whole suite
test: $(DEV_STAMP)
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q
	$(BIN)/ruff check iris_desktop tests bench packaging

lint: $(DEV_STAMP)
	$(BIN)/ruff check iris_desktop tests bench packaging

bench: $(DEV_STAMP)
	$(BIN)/python bench/context_build.py

clean:
	rm -rf build dist .pytest_cache .ruff_cache
