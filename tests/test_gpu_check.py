"""tools/gpu_check.py, rehearsed as on an air-gapped GPU machine: a clean environment holding only torch (the CPU
build of constraints.txt), transformers 5.17.0, pytest and what a CUDA image has of datasets' dependencies (pyarrow,
pandas) — no jieba, datasets or gensim — gets spanlm from the
checkout and the rest from a wheel folder (``make gpu-wheels``) with ``--no-index``, and runs the gpu tests in
their CPU mode (``--device cpu``: SPANLM_GPU_TESTS_DEVICE=cpu) and the bench's dry run through the same script.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import REPO, kept_venv

SCRIPT = REPO / "tools" / "gpu_check.py"
TRANSFORMERS = "5.17.0"  # the oldest transformers pyproject allows: the version a known GPU machine has
# What a CUDA image has of datasets' dependencies (pyarrow, pandas, …): the target below gets them too
IMAGE_HAS = ["pyarrow", "pandas", "xxhash", "fsspec", "requests"]
# What the target has already (the wheel folder leaves them out)
TARGET_HAS = ",".join(
    ["transformers", "tokenizers", "numpy", "safetensors", "pyyaml", "regex", "tqdm", "pytest", "pluggy", "iniconfig"]
    + IMAGE_HAS
)
NO_INDEX = ("Could not find a version", "No matching distribution", "NewConnectionError", "Max retries exceeded")


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wheels_for_a_manylinux_tag_also_take_the_older_manylinux_wheels():
    tags = load_script().platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert load_script().platforms("win_amd64") == ["win_amd64"]


def test_the_check_finds_every_gpu_test_file_and_leaves_torch_to_the_machine():
    script = load_script()
    assert "tests/gpu/test_gpu.py" in script.gpu_test_files()
    assert "torch" not in {script.requirement_name(r) for r in script.spanlm_requirements()}


def clean_env() -> dict[str, str]:
    """This process's environment without what would let the target see this checkout's environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SPANLM_GPU_TESTS_DEVICE")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    return env | {"OMP_NUM_THREADS": "1"}


def pip_or_skip(command: list, what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=clean_env())
    if result.returncode != 0:
        if any(sign in result.stderr for sign in NO_INDEX):
            pytest.skip(f"no package index reachable for {what}: {result.stderr.strip().splitlines()[-1]}")
        pytest.fail(f"{what}: {result.stderr[-2000:]}")


@pytest.fixture(scope="session")
def target_python() -> Path:
    """A clean venv with torch, transformers 5.17.0, pytest and IMAGE_HAS, as pip installs them, kept in the
    user's cache (helpers.kept_venv) per Python and versions. The check never installs into it (spanlm goes to a
    temporary prefix), so a kept one stays clean."""
    torch_version = torch.__version__.split("+")[0]

    def build(venv: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        command = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c", str(REPO / "constraints.txt")]
        packages = [f"torch=={torch_version}", f"transformers=={TRANSFORMERS}", "pytest", *IMAGE_HAS]
        pip_or_skip([*command, *packages], "the target")

    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    name = f"gpu-target-py{python_version}-torch{torch_version}-transformers{TRANSFORMERS}-{'-'.join(IMAGE_HAS)}"
    return kept_venv(name, "import torch, transformers, pyarrow, pandas", build)


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> Path:
    """`make gpu-wheels` for this Python (the target's), leaving out what the target has."""
    out = tmp_path_factory.mktemp("gpu_wheels")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    make = ["make", "-s", "-C", str(REPO), "gpu-wheels", f"PYTHON={sys.executable}", f"PYTHON_VERSION={version}"]
    pip_or_skip([*make, f"WHEELS={out}", f"SKIP={TARGET_HAS}"], "make gpu-wheels")
    return out


@pytest.mark.slow
def test_the_check_installs_from_the_wheels_alone_and_runs_the_gpu_tests_and_bench_on_the_cpu(
    target_python, wheels, tmp_path
):
    names = {path.name.split("-")[0] for path in wheels.glob("*.whl")}
    assert {"jieba", "rjieba", "ninja", "spanlm"} <= names and "torch" not in names and "transformers" not in names
    assert {"dill", "multiprocess"} <= names  # datasets' own dependencies come along
    out = tmp_path / "out"
    command = [str(target_python), str(SCRIPT), "run", "--device", "cpu", "--wheels", str(wheels), "--out", str(out)]
    # Bounded: the variable-length attention's gpu tests and one that needs what the wheels lack (`make gpu-check`
    # rehearses them all), and one bench arm (tests/test_bench_gpu.py runs the bench's CPU dry run over nine).
    command += ["--tests", "test_varlen or macbert", "--", "--arms", "spanbert-packed-eager"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=clean_env(), cwd=tmp_path)
    report = json.loads((out / "gpu_check.json").read_text())
    assert result.returncode == 0, (result.stderr[-2000:], (out / "gpu_check.log").read_text()[-4000:])
    assert report["ok"] and (out / "gpu_check.log").stat().st_size > 0

    environment = report["environment"]
    assert environment["torch"] == torch.__version__ and environment["packages"]["transformers"] == TRANSFORMERS
    assert environment["executable"] == str(target_python) and not environment["cuda_available"]
    assert not Path(environment["spanlm_file"]).is_relative_to(REPO)  # the installed spanlm, not the checkout's
    assert environment["packages"]["gensim"] is None and environment["packages"]["datasets"] is not None
    # jieba is published as an sdist only: the folder holds a wheel built from it
    assert report["dependencies"]["jieba"]["installed"] and report["dependencies"]["rjieba"]["installed"]
    assert report["dependencies"]["datasets"]["installed"] is True

    tests = report["tests"]
    assert report["test_counts"].get("failed", 0) == 0 and report["test_counts"].get("error", 0) == 0
    # the compiled runs are the CPU suite's own tests there (tests/train/test_device_agnostic.py); FlexAttention has
    # no CPU backward (its forward is checked on the CPU in tests/accel/test_disentangled.py)
    expected_skips = ("macbert", "compiles_once", "test_flex_")
    assert all(t["outcome"] == "passed" for name, t in tests.items() if not any(s in name for s in expected_skips))
    assert len(tests) >= 6 and all("test_varlen.py" in name or "macbert" in name for name in tests)
    macbert = next(t for name, t in tests.items() if "macbert" in name)
    assert macbert["outcome"] == "skipped" and "gensim" in macbert["message"]
    assert report["bench"]["bench"] == "train_step_gpu" and report["bench"]["device"] == "cpu (dry run)"
    assert list(report["bench"]["arms"]) == ["spanbert-packed-eager"]
    assert report["bench_exit"] == 0 and set(report["seconds"]) >= {"install", "tests", "bench"}
    # what a check cut short would keep: the figures after the last arm
    partial = json.loads((out / "bench_partial.json").read_text())
    assert partial["arms"].keys() == report["bench"]["arms"].keys()

    # The same on this machine as a GPU check: it stops before the tests, saying why, in the JSON file too.
    command = [str(target_python), str(SCRIPT), "run", "--wheels", str(wheels), "--out", str(tmp_path / "cuda")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=clean_env(), cwd=tmp_path)
    report = json.loads((tmp_path / "cuda" / "gpu_check.json").read_text())
    assert result.returncode == 1 and not report["ok"] and report["error"].startswith("no CUDA device")
    assert "tests" not in report


def test_rehearsing_the_check_leaves_the_spanlm_this_python_has_installed(tmp_path):
    """spanlm goes into the check's prefix without pip uninstalling this Python's own: without
    ``--ignore-installed`` a rehearsal on a development machine took the developer's editable install away (running
    that pip here to show it would do the same to this test session's spanlm)."""
    command = load_script().install_into(tmp_path / "prefix", str(REPO))
    assert "--ignore-installed" in command and command[command.index("--prefix") + 1] == str(tmp_path / "prefix")
