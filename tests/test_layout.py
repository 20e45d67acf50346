"""The package's import graph is acyclic and layered (docs/architecture.md, "Layout"): a module imports
only from its own folder or from folders of a lower layer, at module level and inside functions alike."""

import ast
import subprocess
import sys
from pathlib import Path

import spanlm

PACKAGE = Path(spanlm.__file__).parent

# Lowest first. A folder (or top-level module) may import from its own folder and from lower layers only.
LAYERS = [
    ["spanlm", "spanlm.errors", "spanlm.processes"],
    ["spanlm.files", "spanlm.config", "spanlm.recipes"],
    ["spanlm.cli_support"],
    ["spanlm.data"],
    ["spanlm.heads"],
    ["spanlm.models", "spanlm.masking"],
    ["spanlm.accel"],  # the device speed backend: beside the engine, which alone applies it (tests/accel/test_seam.py)
    ["spanlm.train"],  # the engine: loop, objective interface, checkpoints, distribution, logging
    ["spanlm.objectives", "spanlm.finetune"],  # pretraining objectives; the fine-tuning skeleton (encoder + task head)
    ["spanlm.pretrain", "spanlm.ner", "spanlm.qa", "spanlm.cls"],  # the tasks the engine runs
    ["spanlm.evaluate", "spanlm.report"],  # `spanlm eval` (the tasks' training commands, a process per cell); plots
    ["spanlm.collators", "spanlm.demo"],  # the Hugging Face Trainer's collators; the demo
    ["spanlm.cli"],
    ["spanlm.__main__", "spanlm.fork_server"],  # `python -m spanlm`; the server that forks `spanlm eval`'s cells
]
# The CharBERT modeling file travels with every CharBERT export (transformers' remote code), so it must stand
# alone: it imports nothing of spanlm, and the data layer's char featurizer may share its code.
STANDALONE = {"spanlm.models.modeling_charbert"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def folder_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


LAYER = {folder: rank for rank, folders in enumerate(LAYERS) for folder in folders}


def resolve(name: str) -> str | None:
    """The spanlm module an imported name lives in (``spanlm.a.b.func`` → ``spanlm.a.b``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """Every spanlm module ``module`` imports, anywhere in its file."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            if name.startswith("spanlm") and (target := resolve(name)) not in (None, module):
                found.add(target)
                break
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def test_every_folder_has_a_layer():
    assert sorted({folder_of(m) for m in MODULES} - set(LAYER)) == []


def test_imports_go_down_the_layers():
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if target not in STANDALONE
        and folder_of(target) != folder_of(module)
        and LAYER[folder_of(target)] >= LAYER[folder_of(module)]
    )
    assert upward == []


# The engine (torchtitan's trainer that knows only its spec): the loop, distribution, checkpoints, the optimiser and
# schedule, metrics and the keyed loader. What a task is reaches it through TrainingSetup alone; the device's
# speed backend it applies by name.
ENGINE_IMPORTS = {
    "spanlm",
    "spanlm.errors",
    "spanlm.files",
    "spanlm.processes",
    "spanlm.config",
    "spanlm.cli_support",
    "spanlm.data.blocks",  # the keyed permutation its sampler cuts batches from
    "spanlm.accel",
}


def test_the_engine_knows_no_task_objective_or_masker():
    outside = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if folder_of(module) == "spanlm.train"
        for target in targets
        if folder_of(target) != "spanlm.train" and target not in ENGINE_IMPORTS
    )
    assert outside == []


def test_standalone_modules_import_nothing_of_spanlm():
    assert {module: sorted(GRAPH[module]) for module in STANDALONE if GRAPH[module]} == {}


def test_each_objective_is_one_folder_that_imports_no_other():
    """An objective is one folder, ``spanlm/objectives/<name>/`` (docs/architecture.md): its ``__init__`` registers
    it, and no folder imports another's modules; what objectives share (the masked-LM model, the masked batch's
    fields and encoder run, the heads' import and export) lives in the package's own modules, which register
    nothing."""
    folder = {
        module: module.split(".")[2]
        for module in MODULES
        if module.startswith("spanlm.objectives.") and MODULES[module].parent != PACKAGE / "objectives"
    }
    folders = set(folder.values())
    assert {"mlm", "wwm", "macbert", "spanbert", "charbert", "electra"} <= folders
    for name in sorted(folders):
        assert 'register("' in MODULES[f"spanlm.objectives.{name}"].read_text(encoding="utf-8"), name
    shared = sorted(module for module in MODULES if module.startswith("spanlm.objectives") and module not in folder)
    for module in shared:
        assert 'register("' not in MODULES[module].read_text(encoding="utf-8"), f"{module} registers an objective"
    for module, name in sorted(folder.items()):
        others = sorted(target for target in GRAPH[module] if folder.get(target, name) != name)
        assert others == [], f"{module} imports {others}"


def test_the_import_graph_has_no_cycle():
    # Depth-first search; a back edge is a cycle (within a folder too).
    state, path, cycles = {}, [], []

    def visit(module):
        state[module] = "open"
        path.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == "open":
                cycles.append(" -> ".join(path[path.index(target) :] + [target]))
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = "done"

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert cycles == []


def test_the_cli_starts_without_torch():
    # `spanlm --help` (and every subcommand's parser) stays fast: heavy libraries load inside the commands.
    code = (
        "import sys; from spanlm.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    )


def test_importing_the_objectives_registers_every_folder_without_torch():
    # Recipes, collators and preview find every built-in objective and its masker without importing a folder;
    # a folder's model (and torch) is imported when it is first built.
    code = (
        "import sys; from spanlm.objectives import OBJECTIVES; from spanlm.masking.base import SCHEMES; "
        "[SCHEMES[name].masker_class() for name in sorted(SCHEMES)]; "
        "print(sorted(OBJECTIVES), 'torch' in sys.modules)"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    folders = sorted(path.parent.name for path in (PACKAGE / "objectives").glob("*/__init__.py"))
    assert found == f"{folders} False"
    assert {"charbert", "electra", "macbert", "mlm", "spanbert", "wwm"} <= set(folders)


def test_no_source_file_cites_a_repository_file_a_wheel_lacks():
    """Comments cite the papers and the code; docs/, bench/, BENCHMARKS.md and RESULTS.md are not in a wheel."""
    import re

    cites = re.compile(r"BENCHMARKS\.md|RESULTS\.md|\bdocs/[\w./-]+\.md|\bbench/\w+\.py")
    citing = {name: cites.findall(path.read_text(encoding="utf-8")) for name, path in MODULES.items()}
    assert {name: found for name, found in citing.items() if found} == {}


# A file a newcomer reads top to bottom. The CharBERT modeling file is exempt: it travels alone with every CharBERT
# export as transformers' remote code, so it holds the whole model.
LONGEST_SOURCE_FILE = 500
ONE_FILE_MODELS = {"spanlm.models.modeling_charbert"}


def test_no_source_file_is_over_500_lines():
    long = {
        module: lines
        for module, path in MODULES.items()
        if module not in ONE_FILE_MODELS
        and (lines := len(path.read_text(encoding="utf-8").splitlines())) > LONGEST_SOURCE_FILE
    }
    assert long == {}
