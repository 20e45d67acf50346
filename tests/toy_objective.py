"""A deliberately small objective for testing the training engine on its own.

It predicts masked tokens from a 2-layer MLP over embeddings — tiny and fast, but with dropout (so RNG
restore matters), tied weights (so alias handling matters) and a real masker (so data position and
masking RNG matter). Importing this module registers it as objective "toy".
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from helpers import EMBEDDED_CORPUS
from spanlm.config import from_dict
from spanlm.objectives import register
from spanlm.pretrain.recipe import Recipe
from spanlm.train.metrics import read_metrics
from spanlm.train.objective import Objective


@dataclasses.dataclass
class ToyMasked:
    input_ids: np.ndarray
    attention_mask: np.ndarray
    target_index: np.ndarray
    target_labels: np.ndarray

    def to_torch(self) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(np.asarray(v)) for k, v in dataclasses.asdict(self).items()}


class ToyMasker:
    def __init__(self, mask_id: int, rate: float = 0.15):
        self.mask_id, self.rate = mask_id, rate

    def __call__(self, batch, rng: np.random.Generator) -> ToyMasked:
        chosen = (rng.random(batch.input_ids.shape) < self.rate) & ~batch.special_mask
        flat = np.flatnonzero(chosen)
        input_ids = batch.input_ids.copy()
        labels = input_ids.reshape(-1)[flat].copy()
        input_ids.reshape(-1)[flat] = self.mask_id
        return ToyMasked(input_ids, batch.attention_mask, flat, labels)


class Toy(Objective):
    def __init__(self, vocab_size: int, mask_id: int, hidden: int = 16):
        super().__init__()
        self.masker = ToyMasker(mask_id)
        self.embedding = nn.Embedding(vocab_size, hidden)
        self.layers = nn.ModuleList(
            [nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.Dropout(0.1)) for _ in range(2)]
        )
        self.norm = nn.LayerNorm(hidden)
        self.decoder = nn.Linear(hidden, vocab_size)
        self.decoder.weight = self.embedding.weight  # tied, as real MLM heads are
        self.nan_after = int(os.environ.get("TOY_NAN_AFTER", "0"))  # inject a NaN loss after this many forwards
        self.calls = 0
        # A file to create at the first evaluation forward, after which evaluation forwards are slow: a test
        # signals the run while it evaluates.
        self.eval_mark = os.environ.get("TOY_EVAL_MARK")

    def forward(self, batch):
        self.calls += 1
        if self.eval_mark and not self.training:
            Path(self.eval_mark).touch()
            time.sleep(0.2)
        hidden = self.embedding(batch["input_ids"])  # (B, L, H)
        for layer in self.layers:
            hidden = hidden + layer(hidden)
        rows = self.norm(hidden).flatten(0, 1)[batch["target_index"]]  # (N, H): targets only
        logits = self.decoder(rows)
        loss_sum = nn.functional.cross_entropy(logits.float(), batch["target_labels"], reduction="sum")
        n = batch["target_labels"].numel()
        loss = loss_sum / max(n, 1)
        if self.nan_after and self.calls > self.nan_after and self.training:
            loss = loss * float("nan")
        accuracy = (logits.argmax(-1) == batch["target_labels"]).float().mean() if n else loss.new_zeros(())
        return {"loss": loss, "mlm_loss": loss.detach(), "mlm_accuracy": accuracy}

    def export(self, directory, tokenizer) -> None:
        from safetensors.torch import save_model

        save_model(self, str(directory / "toy.safetensors"))

    def shard_units(self):
        return list(self.layers)


@register("toy", schemes=("mlm",), needs="its own token masker")
def build_toy(recipe, corpus) -> Toy:
    return Toy(corpus.vocab_size, corpus.special_ids["mask"])


def toy_recipe(
    prepared: Path,
    output_dir: Path,
    data: dict | None = None,
    model: dict | None = None,
    objective: str = "toy",
    **train,
) -> Recipe:
    """A short run of ``objective`` on one embedded text (the training tests' corpus); ``data``, ``model`` and the
    train settings given replace the defaults."""
    return from_dict(
        Recipe,
        {
            "seed": 0,
            "data": {
                "inputs": [str(EMBEDDED_CORPUS / "alice_in_wonderland.txt")],
                "prepared_dir": str(prepared),
                "max_len": 32,
                **(data or {}),
            },
            "tokenizer": {"vocab_size": 500},
            "model": model or {},
            "objective": {"name": objective},
            "train": {
                "output_dir": str(output_dir),
                "max_steps": 8,
                "batch_size": 4,
                "lr": 1e-2,
                "warmup_steps": 2,
                "log_every": 1,
                "eval_every": 0,
                "save_every": 1000,
                "keep_last": 5,
                "num_workers": 0,
                "eval_blocks": 8,
                **train,
            },
            "logging": {"report_to": [], "progress": False},
        },
    )


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if r["kind"] == "train"}
