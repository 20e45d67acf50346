# The two set-up commands of the README. Each creates .venv and installs what it needs by itself.
# constraints.txt pins torch to the build this environment provides (CPU here); elsewhere set
# CONSTRAINTS= to let pip choose any torch that pyproject's range allows.
PYTHON ?= python3
VENV ?= .venv
CONSTRAINTS ?= constraints.txt
PIP_CONSTRAINT_FLAG = $(if $(CONSTRAINTS),-c $(CONSTRAINTS),)
BIN = $(VENV)/bin

.PHONY: demo test gpu-check venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Re-install when the package metadata or the pins change.
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(BIN)/python -m pip install --quiet $(PIP_CONSTRAINT_FLAG) -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

# The main job on the embedded data (spanlm demo): pretrain a tiny SpanBERT on the GermEval 2014 training
# text, fine-tune GlobalPointer NER on 3,000 labelled sentences from it and from random initialisation,
# evaluate both, and write runs/demo/report.html and runs/demo/summary.json.
demo: venv
	$(BIN)/spanlm demo --out runs/demo

test: venv
	$(BIN)/ruff check src tests bench docs/results
	$(BIN)/ruff format --check src tests bench docs/results
	$(BIN)/python -m pytest -q

# On a machine with a CUDA GPU (install a CUDA torch: CONSTRAINTS= make gpu-check): the GPU tests (pytest -m gpu:
# per objective a bf16 step, save -> resume, export; NER / QA one step), then bench/train_step_gpu.py's JSON line.
gpu-check: venv
	$(BIN)/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make gpu-check: no CUDA device')"
	$(BIN)/python -m pytest -q -m gpu -rs tests
	$(BIN)/python bench/train_step_gpu.py

clean:
	rm -rf $(VENV) runs .pytest_cache
