"""Benchmark: `spanlm ner predict`'s Python API against transformers' token-classification pipeline.

What is compared (sentences per second, inference only, the same encoder architecture and tokenizer)
    spanlm      ``spanlm.ner.predict.NerModel.predict_texts``: one batched tokenizer call over all texts,
                NumPy windows (max_len 128, stride 32), the encoder + Efficient GlobalPointer (head size
                64) over batches of ``--batch`` windows of similar length, vectorised decoding of every
                (type, start, end) cell above 0, merge in characters, entities with character offsets and
                scores.
    peer        ``transformers.pipeline("token-classification", aggregation_strategy="simple")`` over a
                ``BertForTokenClassification`` built from the same encoder directory (13 BIO labels for
                WNUT-17's 6 types), called on the list of texts with ``batch_size=--batch``: its
                per-sentence pre/post-processing, BIO aggregation into entities with character offsets.

Encoder: a tiny BERT (hidden 128, 2 layers, 2 heads, intermediate 512, 512 positions), random weights,
with a WordPiece tokenizer (vocab 8,000) trained on the WNUT-17 training text. spanlm's side is first
fine-tuned with `ner train` for ``--train-steps`` steps on WNUT-17 train (untimed), because decoding
work depends on how many cells pass the threshold: a random GlobalPointer passes about half of them, a
trained one about as many as there are entities. The peer keeps the random encoder, and its classifier's
bias makes it predict "O" at every token, so that its aggregation returns no entities: it does no more
post-processing than spanlm's decoding of a few dozen (a random classifier would return one for almost
every token and inflate the ratio). The ratio is therefore a lower bound. Texts: the 1,009 sentences
of WNUT-17 dev (data/ner/wnut17/dev.conll, tokens joined by single spaces).

Timing: one warm-up pass per side, then ``--repeats`` passes over all texts, alternating sides (the
order flips every repetition); sentences/s from the median pass. ``ratio`` = spanlm ÷ peer.
Output: one JSON line on stdout.

    python bench/ner_predict.py [--repeats 5] [--batch 32] [--train-steps 200] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--train-steps", type=int, default=200, help="`ner train` steps before timing (batch 32)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--data", default=str(REPO / "data" / "ner" / "wnut17"))
    return parser.parse_args()


def build_encoder(directory: Path, texts: list[str]) -> None:
    """A tiny random BERT + WordPiece tokenizer trained on ``texts``, saved as a Hugging Face directory."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(
        texts,
        trainers.WordPieceTrainer(
            vocab_size=8000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False
        ),
    )  # stdout carries only the JSON line
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(fast),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=512,
        max_position_embeddings=512,
    )
    BertModel(config, add_pooling_layer=False).save_pretrained(str(directory))
    fast.save_pretrained(str(directory))


def train_ner_model(encoder_dir: Path, out: Path, data: Path, steps: int) -> Path:
    """`ner train` on WNUT-17 train for ``steps`` steps (outside the timed region): a head in a trained
    regime, whose decoding sees about as many cells above 0 as there are entities (a random head would
    pass about half of all cells)."""
    from spanlm.config import from_dict
    from spanlm.ner.config import NerRecipe
    from spanlm.ner.task import train_ner

    recipe = from_dict(
        NerRecipe,
        {
            "model": {"path": str(encoder_dir)},
            "data": {"train": str(data / "train.conll"), "format": "conll", "max_len": 128, "stride": 32},
            "train": {
                "output_dir": str(out),
                "max_steps": steps,
                "batch_size": 32,
                "lr": 1e-3,
                "warmup_steps": 0,
                "eval_every": 0,
                "save_every": steps,
                "num_workers": 0,
                "device": "cpu",
            },
            "logging": {"report_to": [], "progress": False},
        },
    )
    run_dir, _ = train_ner(recipe, log=lambda *_: None)
    return run_dir / "model"


def main() -> int:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import BertForTokenClassification, pipeline
    from transformers.utils import logging as hf_logging

    from spanlm.ner.data import ReadOptions, label_set, read_documents
    from spanlm.ner.predict import NerModel

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    train, _ = read_documents(Path(args.data) / "train.conll", ReadOptions(format="conll"))
    dev, _ = read_documents(Path(args.data) / "dev.conll", ReadOptions(format="conll"))
    texts = [d.text for d in dev]
    labels = label_set(train)
    with tempfile.TemporaryDirectory() as tmp:
        encoder_dir = Path(tmp) / "encoder"
        build_encoder(encoder_dir, [d.text for d in train])
        model_dir = train_ner_model(encoder_dir, Path(tmp) / "run", Path(args.data), args.train_steps)
        spanlm_model = NerModel(model_dir, device="cpu")
        bio = ["O"] + [f"{p}-{label}" for label in labels for p in ("B", "I")]
        torch.manual_seed(0)
        peer_model = BertForTokenClassification.from_pretrained(
            str(encoder_dir),
            num_labels=len(bio),
            id2label=dict(enumerate(bio)),
            label2id={l: i for i, l in enumerate(bio)},
        )
        with torch.no_grad():
            peer_model.classifier.bias[0] += 1e4  # "O" everywhere: no entities to aggregate (see the docstring)
        peer = pipeline(
            "token-classification",
            model=peer_model,
            tokenizer=spanlm_model.tokenizer,
            aggregation_strategy="simple",
            device="cpu",
        )

        def run_spanlm():
            return sum(len(d.entities) for d, _ in spanlm_model.predict_texts(texts, args.batch))

        def run_peer():
            with torch.inference_mode():
                return sum(len(found) for found in peer(texts, batch_size=args.batch))

        sides = {"spanlm": run_spanlm, "peer": run_peer}
        times = {name: [] for name in sides}
        entities = {name: fn() for name, fn in sides.items()}  # warm-up
        for repeat in range(args.repeats):
            order = list(sides) if repeat % 2 == 0 else list(sides)[::-1]
            for name in order:
                started = time.perf_counter()
                sides[name]()
                times[name].append(time.perf_counter() - started)
    rate = {name: len(texts) / statistics.median(t) for name, t in times.items()}
    result = {
        "bench": "ner_predict",
        "sentences": len(texts),
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "spanlm_sentences_per_s": round(rate["spanlm"], 1),
        "peer_sentences_per_s": round(rate["peer"], 1),
        "spanlm_entities": entities["spanlm"],
        "peer_entities": entities["peer"],
        "ratio": round(rate["spanlm"] / rate["peer"], 3),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
