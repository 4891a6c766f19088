# Two entry points (see README): `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: demo test install install-dev bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[report]'

install-dev: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'

demo: install
	$(BIN)/flexshard-stream demo

test: install-dev
	$(BIN)/python -m pytest -q

bench: install-dev
	for b in bench/*.py; do $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
