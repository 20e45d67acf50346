# The two set-up commands of the README. Each creates .venv and installs what it needs by itself.
# constraints.txt pins torch to the build this environment provides (CPU here); elsewhere set
# CONSTRAINTS= to let pip choose any torch that pyproject's range allows.
PYTHON ?= python3
VENV ?= .venv
CONSTRAINTS ?= constraints.txt
PIP_CONSTRAINT_FLAG = $(if $(CONSTRAINTS),-c $(CONSTRAINTS),)
BIN = $(VENV)/bin

.PHONY: demo test venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Re-install when the package metadata or the pins change.
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(BIN)/python -m pip install --quiet $(PIP_CONSTRAINT_FLAG) -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

# The main job on the embedded data: prepare the corpora, show the masking, pretrain a tiny SpanBERT,
# then write its report and a Hugging Face export.
demo: venv
	$(BIN)/spanlm prepare configs/prepare/english.yaml
	$(BIN)/spanlm prepare configs/prepare/chinese.yaml
	$(BIN)/spanlm preview configs/pretrain/spanbert.yaml --n 1
	$(BIN)/spanlm pretrain configs/pretrain/spanbert.yaml --resume auto
	$(BIN)/spanlm report runs/pretrain/spanbert
	$(BIN)/spanlm export runs/pretrain/spanbert --out runs/export/spanbert

test: venv
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
