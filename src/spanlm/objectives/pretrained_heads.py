"""An objective's heads in a checkpoint directory: written with an export, read back for continued pretraining.

A head that transformers has a class for (BERT's MLM head, ELECTRA's RTD head; :mod:`spanlm.heads.hf`)
is written into the encoder's own weights as that task model (``BertForMaskedLM``,
``ElectraForPreTraining``, ...), so transformers loads it; the others (SBO, NLM, DeBERTa-V3's RTD head)
go to ``heads.safetensors`` under spanlm's names. Continued pretraining looks for each head of the
objective in the same two places — the transformers names first, so a hub ``*ForMaskedLM`` checkpoint
continues with its own MLM head — and every head it finds is loaded, every other one starts fresh; the
objective records which (``Objective.head_report``) and the loop prints it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from spanlm.errors import InputError
from spanlm.heads.hf import HEADS_FILE, head_state, read_task_head, save_task_model, task_head

OBJECTIVE_FILE = "spanlm_objective.json"


def head_modules(objective: nn.Module) -> dict[str, nn.Module]:
    """The objective's heads: its direct children named ``*_head`` (``None`` for an unused one is skipped)."""
    return {
        name: module for name, module in objective.named_children() if name.endswith("_head") and module is not None
    }


def export_backbone(
    backbone,
    directory: Path,
    head: nn.Module | None = None,
    kind: str | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> bool:
    """``backbone`` as a Hugging Face directory, as the transformers task model of ``head`` when there is one.

    Returns whether ``head`` was written in transformers' form (else it belongs in ``heads.safetensors``).
    """
    spec = task_head(kind, head, backbone.config) if head is not None else None
    save_task_model(backbone, directory, head, spec, state_dict=state_dict)
    return spec is not None


def export_heads(objective: nn.Module, directory: Path, written: set[str], record: dict | None = None) -> None:
    """The heads not ``written`` in transformers' form into ``heads.safetensors``, and the objective's record."""
    from safetensors.torch import save_file

    rest = {
        key: tensor
        for name, module in head_modules(objective).items()
        if name not in written
        for key, tensor in head_state(name, module).items()
    }
    if rest:
        save_file(rest, str(directory / HEADS_FILE))
    record = {"objective": objective.name, **(record or {})}
    (directory / OBJECTIVE_FILE).write_text(json.dumps(record) + "\n", encoding="utf-8")


def load_heads(
    objective: nn.Module,
    directory: Path,
    transformers_heads: dict[str, tuple[str, Path, object]],
    skip: dict[str, str] | None = None,
) -> dict[str, str]:
    """Load every head of ``objective`` that the checkpoint ``directory`` holds; report where each came from.

    ``transformers_heads``: head name → (kind, directory of the transformers checkpoint, its backbone's
    config) for heads that transformers names (ELECTRA's generator head lives in ``generator/``).
    ``skip``: head name → why it must start fresh although a checkpoint may hold it.
    The report (head name → "loaded from …" / "fresh: why") is also kept as ``objective.head_report``.
    """
    from safetensors.torch import load_file

    heads_file = directory / HEADS_FILE
    saved = load_file(str(heads_file)) if heads_file.is_file() else {}
    report = {}
    for name, module in head_modules(objective).items():
        if skip and name in skip:
            report[name] = f"fresh ({skip[name]})"
            continue
        expected = {key: tensor for key, tensor in module.state_dict().items()}
        kind, source, config = transformers_heads.get(name, (None, None, None))
        spec = task_head(kind, module, config) if kind else None
        found = read_task_head(source, spec) if spec is not None else None
        if found is not None:
            for key, tensor in found.items():
                if tensor.shape != expected[key].shape:
                    raise InputError(
                        f"{source}: its {spec.task_class} head has {spec.names[key]} of shape "
                        f"{tuple(tensor.shape)} where this model needs {tuple(expected[key].shape)}; "
                        "the head does not belong to this checkpoint's embedding / tokenizer"
                    )
            module.load_state_dict(found)
            report[name] = f"loaded ({spec.task_class} weights in {source.name or source})"
            continue
        ours = {key: saved.get(f"{name}.{key}") for key in expected}
        if all(tensor is not None and tensor.shape == expected[key].shape for key, tensor in ours.items()):
            module.load_state_dict(ours)
            report[name] = f"loaded ({HEADS_FILE})"
        elif any(tensor is not None for tensor in ours.values()):
            report[name] = f"fresh (the {HEADS_FILE} head has other shapes: another configuration)"
        else:
            report[name] = "fresh (not in the checkpoint)"
    objective.head_report = report
    return report


def export_with_heads(objective: nn.Module, directory: Path) -> None:
    """The backbone with its MLM head as transformers' ``*ForMaskedLM``; other heads in heads.safetensors."""
    written = {"mlm_head"} if export_backbone(objective.backbone, directory, objective.mlm_head, "mlm") else set()
    export_heads(objective, directory, written)


def load_heads_if_present(objective: nn.Module, model_path: str | None) -> None:
    """Continued pretraining from a checkpoint directory starts from every head it holds (the MLM head of a
    transformers ``*ForMaskedLM``, spanlm's other heads from heads.safetensors); the rest start fresh."""
    if model_path:
        load_heads(objective, Path(model_path), {"mlm_head": ("mlm", Path(model_path), objective.backbone.config)})


def describe_heads(report: dict[str, str]) -> str:
    """One line: ``mlm_head loaded (...); sbo_head fresh (...)``."""
    return "; ".join(f"{name} {status}" for name, status in report.items())
