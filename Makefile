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

# TorchRec on CPU (docs/TORCHREC_RUNTIME.md): torch's +cpu wheel first (pip would otherwise take the
# CUDA build of 2.13.0 and its nvidia packages), then the project with its extras, then the two
# packages whose declared dependencies are wrong for CPU, without dependencies.
TORCH_CPU   = torch==2.13.0+cpu
TORCHREC_NODEPS = torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0

install-dev: $(BIN)/python
	$(BIN)/python -m pip install --quiet '$(TORCH_CPU)'
	$(BIN)/python -m pip install --quiet -e '.[dev,torchrec]'
	$(BIN)/python -m pip install --quiet --no-deps $(TORCHREC_NODEPS)
	$(BIN)/python -c "import torch, torchrec; assert torch.version.cuda is None, torch.__version__"

demo: install
	$(BIN)/flexshard-stream demo

test: install-dev
	$(BIN)/python -m pytest -q

bench: install-dev
	for b in bench/*.py; do $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
