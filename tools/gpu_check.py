"""The offline GPU check: install spanlm beside a CUDA torch already there, run the gpu tests and the GPU bench.

Two commands, both run with the Python of the machine they are for (standard library only):

``python3 tools/gpu_check.py wheels --out WHEELS [--python-version 3.12] [--platform manylinux_2_28_x86_64]``
    On a machine with a package index: the wheels of spanlm's dependencies other than torch (and of pytest)
    for the named Python and platform, one ``pip download --only-binary=:all:`` per requirement but those
    named by ``--skip`` (what the machine has: keeps the folder small), with the requirement's own
    dependencies less those named by ``--skip`` and the CUDA stack (torch, nvidia-*, triton); a requirement
    published only as an sdist (jieba) is built into a wheel with ``pip wheel --no-deps`` when the result is
    pure Python. Then spanlm's own wheel. (``make gpu-wheels`` runs this.)

``python3 tools/gpu_check.py run --out DIR [--wheels WHEELS] [--device cuda|cpu]``
    On the GPU machine, from a checkout of this repository (the tests and the bench come from it), with no
    network: uses this Python and its torch as they are and never creates an environment that could pull
    torch. It installs spanlm from the checkout with ``pip install --no-deps --no-build-isolation
    --no-index`` (where this Python cannot build it, lacking setuptools: WHEELS' spanlm wheel) into a
    prefix of its own, a temporary folder put on PYTHONPATH (the Python's own environment is left
    untouched), then each requirement of spanlm this Python lacks, one at a time, from WHEELS
    (``--no-index --find-links``); one that cannot be installed is recorded, and the tests that need it
    skip. Then ``pytest -m gpu`` on every test file that has gpu tests, then bench/train_step_gpu.py.
    Writes DIR/gpu_check.json (the environment: GPU, Python, torch / CUDA / transformers versions; what was
    installed; every test's outcome and time; the bench's JSON line; wall times), DIR/gpu_check.log
    (everything the steps printed) and pytest's DIR/pytest-gpu.xml. Exit status 0 when no test failed and
    the bench printed its line. ``--device cpu`` is the rehearsal where no GPU is at hand: the same steps
    with ``SPANLM_GPU_TESTS_DEVICE=cpu`` and the bench's ``--tiny --device cpu`` dry run. (``make
    gpu-check`` runs this.)

On a GPU machine that receives a working tree and a few carried folders but reaches no index, prepare the
folder here and keep it small with ``--skip`` (what that machine has), for example::

    python3 tools/gpu_check.py wheels --out .whl --python-version 3.12 \
        --skip transformers,tokenizers,numpy,safetensors,pyarrow,pyyaml,regex,tqdm,pytest,pluggy,iniconfig
    # there, in the checkout, with .whl carried along (or lying untracked in the tree):
    python3 tools/gpu_check.py run --wheels .whl --out "$OUT"

The tests and the bench together are bounded by ``--budget`` seconds (480 by default: what one H100 check
may take; installing is not counted); the bench gets what the tests left and starts no arm after that, and
rewrites DIR/bench_partial.json after every arm (a bench stopped at the deadline keeps what ran). Options after
``--`` go to the bench (``-- --arms cli-modern-compiled,modern-packed-compiled``); ``--bench-only`` skips the
tests (a second call on the same checkout); ``--tests EXPR`` runs only the gpu tests ``pytest -k EXPR`` selects
(the CPU suite's rehearsal of this script runs a few: ``make gpu-check`` runs them all).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "tools/gpu_check.py"
# Needed to run the gpu tests, beside spanlm's own requirements (the test files import them).
TEST_REQUIREMENTS = ["pytest>=8", "pluggy", "iniconfig"]
# What a dependency closure may hold but the machine's CUDA PyTorch brings: never put in the folder.
MACHINE_OWN = ("torch", "nvidia-", "triton", "cuda-")
# The Hub is never reached: every model in the tests and the bench is built from a config.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


class Log:
    """Every step's command and output, appended to DIR/gpu_check.log; a one-line summary on stderr."""

    def __init__(self, path: Path):
        self.file = path.open("w", encoding="utf-8")

    def say(self, line: str) -> None:
        print(f"{SCRIPT}: {line}", file=sys.stderr, flush=True)
        self.file.write(f"## {line}\n")
        self.file.flush()

    def run(self, command: list[str], env: dict | None = None, timeout: float | None = None, **kwargs):
        """Run ``command``, its stderr written to the log as it comes (a check cut short still shows how far
        it got), its stdout captured and then logged. Returns (exit status or "timeout", stdout, seconds)."""
        shown = [f"<{len(arg.splitlines())} lines>" if "\n" in arg else arg for arg in command]
        self.file.write(f"$ {' '.join(shown)}\n")
        self.file.flush()
        started = time.monotonic()
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=self.file, text=True, errors="replace", **kwargs
        )
        try:
            out, _ = process.communicate(timeout=timeout)
            code = process.returncode
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
            code = "timeout"
        self.file.write(out + f"[exit {code}]\n")
        self.file.flush()
        return code, out, time.monotonic() - started


def pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]


def install_into(prefix: Path, source: str) -> list[str]:
    """pip installing spanlm from ``source`` into ``prefix`` alone: ``--ignore-installed``, or pip would first
    uninstall the spanlm this Python already has (a developer's editable install, when the check is rehearsed)."""
    flags = ["--no-deps", "--no-build-isolation", "--no-index", "--ignore-installed", "--prefix", str(prefix)]
    return pip("install", "--no-warn-script-location", *flags, source)


def spanlm_requirements() -> list[str]:
    """pyproject's [project] dependencies (torch left out: the machine's own is used)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        from pip._vendor import tomli as tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [r for r in project["dependencies"] if requirement_name(r) != "torch"]


def requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def wheel_name(wheel: Path) -> str:
    """The project name of a wheel file (``multiprocess-0.70.18-py312-none-any.whl`` → ``multiprocess``)."""
    return requirement_name(wheel.name.split("-", 1)[0])


# ---------------------------------------------------------------- wheels (a machine with an index)


def platforms(tag: str) -> list[str]:
    """``tag`` and the older manylinux tags a machine of that tag also runs (pip download --platform takes
    each tag literally: a ``manylinux_2_17`` wheel such as tokenizers' is not found for ``manylinux_2_28``)."""
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", tag)
    if not match:
        return [tag]
    glibc, arch = int(match.group(1)), match.group(2)
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)]
    return tags + [f"{legacy[minor]}_{arch}" for minor in legacy if minor <= glibc]


def download_wheels(args) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    target = ["--python-version", args.python_version, "--implementation", "cp"]
    target += [option for tag in platforms(args.platform) for option in ("--platform", tag)]
    skip = {requirement_name(name) for name in args.skip.split(",") if name.strip()}
    failed = []
    for requirement in [*spanlm_requirements(), *TEST_REQUIREMENTS]:
        if requirement_name(requirement) in skip:
            continue
        # With its dependencies (datasets needs dill and multiprocess, which a CUDA image seldom has), less what
        # --skip says the machine has and never the machine's own torch stack.
        with tempfile.TemporaryDirectory() as closure:
            with_dependencies = pip("download", "--only-binary=:all:", *target, "-d", closure, requirement)
            if subprocess.run(with_dependencies).returncode == 0:
                for wheel in Path(closure).glob("*.whl"):
                    name = wheel_name(wheel)
                    if name not in skip and not name.startswith(MACHINE_OWN):
                        shutil.copy2(wheel, out / wheel.name)
                continue
        binary = pip("download", "--only-binary=:all:", "--no-deps", *target, "-d", str(out), requirement)
        if subprocess.run(binary).returncode == 0:
            continue
        # Published as an sdist only (jieba): build it, and keep the wheel if it is pure Python.
        with tempfile.TemporaryDirectory() as sdists:
            built = subprocess.run(pip("download", "--no-binary=:all:", "--no-deps", "-d", sdists, requirement))
            sdist = next(Path(sdists).iterdir(), None) if built.returncode == 0 else None
            if sdist is None or subprocess.run(pip("wheel", "--no-deps", "-w", sdists, str(sdist))).returncode:
                failed.append(requirement)
                continue
            wheels = [w for w in Path(sdists).glob("*.whl") if w.name.endswith("-none-any.whl")]
            if not wheels:
                failed.append(f"{requirement} (its wheel is not pure Python)")
                continue
            for wheel in wheels:
                shutil.copy2(wheel, out / wheel.name)
    # spanlm's own wheel (for a machine without the checkout; the check itself builds from the checkout)
    if subprocess.run(pip("wheel", "--no-deps", "-w", str(out), str(REPO))).returncode:
        failed.append("spanlm")
    if failed:
        print(f"{SCRIPT}: no wheel for {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"{SCRIPT}: {len(list(out.glob('*.whl')))} wheels in {out}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- the check (the GPU machine)

ENVIRONMENT = """
import json, platform, sys
from importlib import metadata
import torch
names = ["transformers", "tokenizers", "numpy", "safetensors", "pyarrow", "pytest", "accelerate",
         "jieba", "rjieba", "datasets", "gensim"]
versions = {}
for name in names:
    try:
        versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        versions[name] = None
cuda = torch.cuda.is_available()
import spanlm
print(json.dumps({
    "python": platform.python_version(), "executable": sys.executable, "torch": torch.__version__,
    "cuda": torch.version.cuda, "cuda_available": cuda,
    "gpu": torch.cuda.get_device_name(0) if cuda else None,
    "gpu_count": torch.cuda.device_count() if cuda else 0,
    "spanlm": metadata.version("spanlm"), "spanlm_file": spanlm.__file__,
    "packages": versions,
}))
"""

MISSING = """
import json, sys
from importlib import metadata
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
missing = []
for line in sys.argv[1:]:
    requirement = Requirement(line)
    if requirement.marker is not None and not requirement.marker.evaluate():
        continue
    try:
        version = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        missing.append([line, None])
        continue
    if not requirement.specifier.contains(version, prereleases=True):
        missing.append([line, version])
print(json.dumps(missing))
"""


def site_packages(prefix: Path) -> Path:
    """Where pip put spanlm under ``--prefix`` (lib/pythonX.Y/site-packages, or dist-packages on Debian)."""
    found = sorted(prefix.glob("lib*/python*/*-packages/spanlm"))
    if not found:
        raise SystemExit(f"{SCRIPT}: pip installed no spanlm package under {prefix}")
    return found[0].parent


def gpu_test_files() -> list[str]:
    """Every test file with gpu-marked tests (collecting only these: a file that imports a missing optional
    dependency at the top is not collected)."""
    return sorted(
        str(path.relative_to(REPO))
        for path in (REPO / "tests").rglob("test_*.py")
        if "pytest.mark.gpu" in path.read_text(encoding="utf-8")
    )


def test_outcomes(junit: Path) -> dict:
    """Per test (pytest's node id): outcome, seconds, and the first line of a failure or skip."""
    if not junit.is_file():
        return {}
    outcomes = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        name = f"{path}.py::{case.get('name')}"
        outcome, message = "passed", None
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or "").splitlines()[0][:300] if child.get("message") else None
                break
        outcomes[name] = {"outcome": outcome, "seconds": round(float(case.get("time", 0)), 2)}
        if message:
            outcomes[name]["message"] = message
    return outcomes


def run_check(args) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "gpu_check.log")
    report: dict = {"check": "spanlm gpu check", "device": args.device, "ok": False, "seconds": {}}
    json_path = out / "gpu_check.json"

    def write() -> None:
        json_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")

    prefix = Path(args.prefix).resolve() if args.prefix else Path(tempfile.mkdtemp(prefix="spanlm-gpu-check-"))
    env = {**os.environ, **OFFLINE, "PIP_NO_INDEX": "1", "PIP_BREAK_SYSTEM_PACKAGES": "1"}
    env.pop("PIP_FIND_LINKS", None)
    try:
        # 1. spanlm from this checkout, into the prefix, torch untouched.
        started = time.monotonic()
        log.say(f"installing spanlm from {REPO} into {prefix} (pip --no-deps --no-build-isolation --no-index)")
        code, _, _ = log.run(install_into(prefix, str(REPO)), env=env)
        report["spanlm_from"] = "checkout"
        built = sorted(Path(args.wheels).glob("spanlm-*.whl")) if args.wheels else []
        if code != 0 and built:  # no setuptools >= 68 in this Python to build with: the folder's wheel
            log.say(f"building from the checkout failed; installing {built[-1].name} (built from its checkout)")
            code, _, _ = log.run(install_into(prefix, str(built[-1])), env=env)
            report["spanlm_from"] = built[-1].name
        if code != 0:
            report["error"] = f"pip could not install spanlm from the checkout (exit {code}): see gpu_check.log"
            return finish(report, write, log, 1)
        site = site_packages(prefix)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(site), env.get("PYTHONPATH", "")] if p)
        env["PATH"] = os.pathsep.join([str(prefix / "bin"), env.get("PATH", "")])

        # 2. what this Python lacks of spanlm's requirements and the tests', one at a time from the wheels.
        requirements = [*spanlm_requirements(), *TEST_REQUIREMENTS]
        code, stdout, _ = log.run([sys.executable, "-c", MISSING, *requirements], env=env)
        missing = json.loads(stdout) if code == 0 else [[r, None] for r in requirements]
        report["dependencies"] = {}
        for requirement, present in missing:
            name = requirement_name(requirement)
            entry = {"requirement": requirement, "present": present}
            if args.wheels:
                command = pip("install", "--no-warn-script-location", "--no-index", "--find-links")
                command += [str(Path(args.wheels).resolve()), "--prefix", str(prefix), requirement]
                code, _, _ = log.run(command, env=env)
                entry["installed"] = code == 0
            else:
                entry["installed"] = False
            report["dependencies"][name] = entry
            log.say(f"{requirement}: {'installed from the wheels' if entry['installed'] else 'missing'}")
        report["seconds"]["install"] = round(time.monotonic() - started, 1)

        # 3. the environment as the tests will see it.
        code, stdout, _ = log.run([sys.executable, "-c", ENVIRONMENT], env=env)
        if code != 0:
            report["error"] = "this Python cannot import torch or the installed spanlm: see gpu_check.log"
            return finish(report, write, log, 1)
        report["environment"] = json.loads(stdout.strip().splitlines()[-1])
        report["environment"]["platform"] = platform.platform()
        log.say(f"environment: {json.dumps(report['environment'])}")
        if args.device == "cuda" and not report["environment"]["cuda_available"]:
            report["error"] = "no CUDA device (the rehearsal without a GPU is --device cpu)"
            return finish(report, write, log, 1)
        if args.device == "cpu":
            env["SPANLM_GPU_TESTS_DEVICE"] = "cpu"
        write()

        # 4. the gpu tests (not with --bench-only: a second call that measures more arms).
        deadline = time.monotonic() + args.budget
        counts: dict[str, int] = {}
        if not args.bench_only:
            files = gpu_test_files()
            log.say(f"pytest -m gpu on {' '.join(files)}")
            junit = out / "pytest-gpu.xml"
            command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-rs", "-p", "no:cacheprovider"]
            command += [f"--junitxml={junit}", *files, *(["-k", args.tests] if args.tests else [])]
            code, stdout, seconds = log.run(command, env=env, cwd=REPO, timeout=args.budget)
            report["seconds"]["tests"] = round(seconds, 1)
            report["tests"] = test_outcomes(junit)
            for entry in report["tests"].values():
                counts[entry["outcome"]] = counts.get(entry["outcome"], 0) + 1
            report["test_counts"] = counts
            report["pytest_exit"] = code
            log.say(f"tests: {counts} (pytest exit {code}, {seconds:.0f} s)")
            write()

        # 5. the GPU bench, in the time left: an arm starts only while its --budget lasts (a compiled base-size arm
        # takes about a minute); the figures so far are rewritten into OUT/bench_partial.json after every arm, so a
        # bench stopped at the deadline keeps what ran.
        left = deadline - time.monotonic() - 10
        bench = [sys.executable, str(REPO / "bench" / "train_step_gpu.py"), "--work", str(prefix / "bench")]
        bench += ["--budget", str(round(max(left - 75, 0))), "--partial", str(out / "bench_partial.json")]
        if args.device == "cpu":  # the dry run, at its smallest: the rehearsal is of this script, not of the bench
            bench += ["--tiny", "--device", "cpu", "--steps", "2", "--warmup", "1", "--batches", "2"]
            bench += ["--peak-size", "256", "--arms", "spanbert-packed-eager,peer-sdpa-eager,gdes-padded-eager"]
        bench += args.bench_args
        log.say(f"bench: {' '.join(bench[1:])} ({left:.0f} s left)")
        code, stdout, seconds = log.run(bench, env=env, cwd=REPO, timeout=max(left, 1))
        report["seconds"]["bench"] = round(seconds, 1)
        report["bench_exit"] = code
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        report["bench"] = json.loads(lines[-1]) if code == 0 and lines else None
        passed = code == 0 and report["bench"] is not None
        if not args.bench_only:
            passed = passed and report["pytest_exit"] == 0 and counts.get("passed", 0) > 0
            passed = passed and not counts.get("failed") and not counts.get("error")
        return finish(report, write, log, 0 if passed else 1)
    finally:
        if not args.prefix:
            shutil.rmtree(prefix, ignore_errors=True)


def finish(report: dict, write, log: Log, code: int) -> int:
    report["ok"] = code == 0
    report["seconds"]["checked"] = round(sum(report["seconds"].get(k, 0) for k in ("tests", "bench")), 1)
    write()
    log.say(("passed" if code == 0 else f"FAILED: {report.get('error', 'see gpu_check.json')}") + ": gpu_check.json")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    wheels = commands.add_parser("wheels", help="download the dependencies' wheels (a machine with an index)")
    wheels.add_argument("--out", required=True, help="the wheel folder")
    wheels.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    wheels.add_argument("--platform", default="manylinux_2_28_x86_64", help="its platform tag")
    wheels.add_argument(
        "--skip", default="", help="comma-separated packages the GPU machine has already (their wheels are left out)"
    )
    run = commands.add_parser("run", help="install and run the check (the GPU machine, no index needed)")
    run.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.log")
    run.add_argument("--wheels", help="folder of wheels for what this Python lacks (from the wheels command)")
    run.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the rehearsal without a GPU")
    run.add_argument("--prefix", help="install spanlm here and keep it (default: a temporary folder, removed)")
    run.add_argument("--budget", type=float, default=480, help="seconds for the tests and the bench together")
    run.add_argument("--bench-only", action="store_true", help="the bench alone (a second call's other arms)")
    run.add_argument(
        "--tests", help="only the gpu tests pytest -k selects by this expression (a bounded rehearsal; default: all)"
    )
    run.add_argument("bench_args", nargs="*", help="after --: extra options for bench/train_step_gpu.py")
    args = parser.parse_args(argv)
    return download_wheels(args) if args.command == "wheels" else run_check(args)


if __name__ == "__main__":
    sys.exit(main())
