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

# The main job on the embedded data: prepare the corpus, pretrain a tiny SpanBERT, export it, fine-tune
# GlobalPointer NER on WNUT-17, evaluate, predict, and write runs/demo/report.html (spanlm demo).
demo: venv
	$(BIN)/spanlm demo --out runs/demo

test: venv
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
