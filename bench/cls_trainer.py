"""Benchmark: `spanlm cls train` against a plain transformers `Trainer` run of the same model, data and settings.

What is compared (dev accuracy, several seeds each)
    spanlm      ``spanlm.cls.task.train_cls`` on a GLUE SST-2 folder (``--data``: train.tsv, dev.tsv): the encoder
                below with BERT's stock head (``bert.pooler`` + ``classifier``), AdamW (eps 1e-6, weight decay
                0.01 on all but biases and LayerNorm), gradient clipping at 1.0, linear warm-up (10% of the steps)
                and decay, batches of ``--batch`` sentences truncated to ``--max-length`` tokens.
    peer        ``transformers.Trainer`` on ``BertForSequenceClassification.from_pretrained`` of the same encoder
                directory, the same tokenizer calls (truncation at ``--max-length``, dynamic padding), and the same
                optimiser, schedule, clipping, batch size, steps and seeds; accuracy of ``Trainer.predict`` on dev.

Encoder: a tiny BERT (hidden ``--hidden``, 2 layers, 2 heads, intermediate 4×hidden, 128 positions) with random
weights drawn once (seed 0) and saved, so both sides start from the same weights, and a WordPiece (vocab 8,000)
trained on the training sentences. The question is whether spanlm's task is right at a real scale: both sides
should land within seed noise of each other, and a randomly initialised encoder trained on the whole of SST-2
should beat the majority class (about 51% of dev) clearly.

Output: one JSON line on stdout with each side's accuracies per seed, their means and standard deviations, the
difference of the means and the dev set's majority-class accuracy.

    python bench/cls_trainer.py --data PATH/TO/SST-2 [--steps 2000] [--seeds 0 1 2] [--threads N]
    python bench/cls_trainer.py --steps 60        # the embedded 500-sentence piece (data/cls/sst2): a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(REPO / "data" / "cls" / "sst2"), help="a folder with train.tsv, dev.tsv")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    return parser.parse_args()


def build_encoder(directory: Path, texts: list[str], hidden: int) -> None:
    import torch
    from transformers import BertConfig, BertModel

    from spanlm.data.tokenizer import TokenizerConfig, train_tokenizer

    tokenizer = train_tokenizer(texts, TokenizerConfig(vocab_size=8000, min_frequency=2))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=4 * hidden,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
    )
    BertModel(config, add_pooling_layer=True).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))


def spanlm_accuracy(args, encoder: Path, out: Path, seed: int) -> float:
    from spanlm.cls.config import ClsRecipe
    from spanlm.cls.task import train_cls
    from spanlm.config import from_dict

    data = Path(args.data)
    recipe = from_dict(
        ClsRecipe,
        {
            "seed": seed,
            "model": {"path": str(encoder)},
            "data": {"train": str(data / "train.tsv"), "dev": str(data / "dev.tsv"), "task": "sst2"},
            "train": {
                "output_dir": str(out),
                "max_steps": args.steps,
                "batch_size": args.batch,
                "lr": args.lr,
                "warmup_steps": args.steps // 10,
                "weight_decay": 0.01,
                "eval_every": 0,
                "save_every": args.steps,
                "num_workers": 0,
                "device": "cpu",
            },
            "logging": {"report_to": [], "progress": False},
        },
    )
    recipe.data.max_length = args.max_length
    _, result = train_cls(recipe, log=lambda *_: None)
    return result["accuracy"]


def read_sst2(path: Path) -> tuple[list[str], list[int]]:
    from spanlm.cls.config import ClsDataConfig
    from spanlm.cls.data import read_examples

    examples = read_examples(str(path), ClsDataConfig(task="sst2"), False, "train", "split")
    return [e.text for e in examples], [int(e.label) for e in examples]


def trainer_accuracy(args, encoder: Path, out: Path, seed: int) -> float:
    import numpy as np
    from datasets import Dataset
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    set_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(encoder))
    model = AutoModelForSequenceClassification.from_pretrained(str(encoder), num_labels=2)

    def dataset(name: str) -> Dataset:
        texts, labels = read_sst2(Path(args.data) / name)
        encoded = tokenizer(texts, truncation=True, max_length=args.max_length)
        return Dataset.from_dict({**encoded, "labels": labels})

    train, dev = dataset("train.tsv"), dataset("dev.tsv")
    settings = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=args.batch,
        per_device_eval_batch_size=64,
        learning_rate=args.lr,
        max_steps=args.steps,
        warmup_steps=args.steps // 10,
        lr_scheduler_type="linear",
        weight_decay=0.01,
        adam_epsilon=1e-6,
        max_grad_norm=1.0,
        seed=seed,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=settings, train_dataset=train, data_collator=DataCollatorWithPadding(tokenizer))
    trainer.train()
    predicted = trainer.predict(dev)
    return 100.0 * float(np.mean(predicted.predictions.argmax(1) == np.asarray(dev["labels"])))


def main() -> None:
    args = parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    sys.path.insert(0, str(REPO / "src"))
    texts, _ = read_sst2(Path(args.data) / "train.tsv")
    _, dev_labels = read_sst2(Path(args.data) / "dev.tsv")
    with tempfile.TemporaryDirectory() as tmp:
        encoder = Path(tmp) / "encoder"
        build_encoder(encoder, texts, args.hidden)
        ours = [spanlm_accuracy(args, encoder, Path(tmp) / f"spanlm-{seed}", seed) for seed in args.seeds]
        theirs = [trainer_accuracy(args, encoder, Path(tmp) / f"trainer-{seed}", seed) for seed in args.seeds]

    def spread(values: list[float]) -> float:
        return statistics.stdev(values) if len(values) > 1 else 0.0

    print(
        json.dumps(
            {
                "data": args.data,
                "train_sentences": len(texts),
                "steps": args.steps,
                "seeds": args.seeds,
                "spanlm": ours,
                "trainer": theirs,
                "spanlm_mean": statistics.mean(ours),
                "spanlm_std": spread(ours),
                "trainer_mean": statistics.mean(theirs),
                "trainer_std": spread(theirs),
                "difference": statistics.mean(ours) - statistics.mean(theirs),
                "majority_class": 100.0 * max(dev_labels.count(0), dev_labels.count(1)) / len(dev_labels),
            }
        )
    )


if __name__ == "__main__":
    main()
