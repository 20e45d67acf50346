# The two set-up commands of the README. Each creates .venv and installs what it needs by itself.
# constraints.txt pins torch to the build this environment provides (CPU here); elsewhere set
# CONSTRAINTS= to let pip choose any torch that pyproject's range allows.
PYTHON ?= python3
VENV ?= .venv
CONSTRAINTS ?= constraints.txt
PIP_CONSTRAINT_FLAG = $(if $(CONSTRAINTS),-c $(CONSTRAINTS),)
BIN = $(VENV)/bin

.PHONY: demo test test-fast gpu-check gpu-wheels venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Re-install when the package metadata or the pins change.
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(BIN)/python -m pip install --quiet $(PIP_CONSTRAINT_FLAG) -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

# The main job on the embedded data (spanlm demo): pretrain a tiny CharBERT on the GermEval 2014 training
# text, fine-tune GlobalPointer NER on 500 labelled sentences from it and from random initialisation (whole and
# with the encoder frozen), evaluate them, and write runs/demo/report.html and runs/demo/summary.json.
demo: venv
	$(BIN)/spanlm demo --out runs/demo

# The whole suite in TEST_WORKERS processes (pytest-xdist; a test file stays in one process; the files with slow
# tests first, tests/conftest.py says why), the slowest tests listed at the end (docs/development.md keeps a
# measured list). TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: venv
	$(BIN)/ruff check src tests bench tools examples
	$(BIN)/ruff format --check src tests bench tools examples
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

# The inner loop: the unit tests, without the ones marked slow (a training loop, a subprocess, a whole command).
test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow"

# The offline GPU check (tools/gpu_check.py --help). On the GPU machine, in this checkout, with its own CUDA torch
# and no network: installs spanlm beside that torch (pip --no-deps --no-build-isolation, into a temporary prefix)
# and what $(PYTHON) lacks from WHEELS, runs pytest -m gpu and bench/train_step_gpu.py, writes OUT/gpu_check.json
# and OUT/gpu_check.log. Creates no venv.
OUT ?= runs/gpu-check
WHEELS ?=
gpu-check:
	$(PYTHON) tools/gpu_check.py run --out $(OUT) $(if $(WHEELS),--wheels $(WHEELS),)

# On a machine with an index: the wheels of spanlm's dependencies but torch (and pytest's) for the GPU machine's
# Python and platform, leaving out the packages named in SKIP (comma-separated: what that machine has), and spanlm's.
PYTHON_VERSION ?= 3.12
PLATFORM ?= manylinux_2_28_x86_64
SKIP ?=
gpu-wheels:
	$(PYTHON) tools/gpu_check.py wheels --out $(or $(WHEELS),wheels) --python-version $(PYTHON_VERSION) \
		--platform $(PLATFORM) --skip "$(SKIP)"

clean:
	rm -rf $(VENV) runs .pytest_cache
