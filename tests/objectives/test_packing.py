"""Packed batches (spanlm.data.packing: one stream, variable-length attention) give every objective the padded
batch's losses and gradients, and no information crosses the blocks sharing the stream. As the trainer runs them
(the device's packed attention set by spanlm.accel before the first forward): one graph under torch.compile with
no break, few recompiles over many batches of other widths, and no host read in a training step."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounter

from helpers import EMBEDDED_CORPUS, REPO
from spanlm import accel
from spanlm.accel import varlen
from spanlm.data.blocks import BlockDataset, collate_blocks
from spanlm.data.packing import pack_masked, stream_layout
from spanlm.data.shards import PreparedCorpus
from spanlm.masking.base import MASK, MaskedBatch
from spanlm.models.packed import encoder_states
from spanlm.objectives import build_objective
from spanlm.pretrain.recipe import load_recipe
from spanlm.train.parallel import compile_recurrent_layers

INPUTS = [str(p) for p in sorted(EMBEDDED_CORPUS.glob("*.txt")) if "hongloumeng" not in p.name]  # as embedded_prepared
MAX_LEN = 32
TINY = [
    "model.hidden_size=32",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "model.num_layers=2",
    "model.max_position_embeddings=64",
    "model.hidden_dropout=0.0",
    "model.attention_dropout=0.0",
]
# recipe of configs/pretrain/, overrides: every objective, ELECTRA with each sharing mode, other families.
CASES = {
    "mlm": ("mlm", []),
    "wwm": ("wwm", []),
    "spanbert": ("spanbert", []),
    # (the session's corpus has no similar-word table: the n-gram masker's [MASK] share stands in for it)
    "macbert": ("macbert", ["masking.ngram.proportions.mask=0.8", "masking.ngram.proportions.similar=0.0"]),
    "mlm-roberta": ("mlm", ["model.family=roberta"]),
    "electra-es": ("electra", []),
    "electra-gdes-sbo": (
        "electra",
        ["objective.electra.sharing=gdes", "objective.electra.generator_head=sbo", "masking.scheme=span"],
    ),
    "electra-none-electra-family": ("electra", ["objective.electra.sharing=none", "model.family=electra"]),
    "deberta-v3-gdes": ("deberta_v3_gdes", []),
    "charbert": (
        "charbert",
        [
            "model.hidden_size=32",
            "objective.charbert.char_embedding_size=16",
            "masking.noise.term_vocab_size=100",
            "masking.noise.max_len=40",
        ],
    ),
}


def recipe(name: str, prepared, output_dir, *overrides: str):
    return load_recipe(
        REPO / "configs" / "pretrain" / f"{name}.yaml",
        [
            f"data.inputs={json.dumps(INPUTS)}",
            f"data.prepared_dir={prepared}",
            f"data.max_len={MAX_LEN}",
            "tokenizer.vocab_size=2000",
            *TINY,
            "data.similar_words=none",
            f"train.output_dir={output_dir}",
            "train.num_workers=0",
            "logging.report_to=[]",
            "logging.progress=false",
            *overrides,
        ],
    )


@pytest.fixture(scope="module")
def corpus(embedded_prepared) -> PreparedCorpus:
    return PreparedCorpus(embedded_prepared)


def build(corpus, tmp_path, case: str):
    name, overrides = CASES[case]
    torch.manual_seed(0)
    return build_objective(recipe(name, corpus.directory, tmp_path / "run", *overrides), corpus)


def mixed_blocks(corpus, count: int = 12) -> list:
    """Blocks of many lengths (the shortest and longest of the corpus, alternating), so rows hold several."""
    blocks = BlockDataset(corpus, MAX_LEN)
    by_length = np.argsort(blocks.index[:, 1] - blocks.index[:, 0], kind="stable")
    picked = np.ravel(np.column_stack([by_length[: count // 2], by_length[::-1][: count // 2]]))
    return [blocks[int(i)] for i in picked]


def parameters_gradients(objective, batch) -> tuple[dict, dict]:
    objective.zero_grad(set_to_none=True)
    output = objective(batch)
    output["loss"].backward()
    grads = {name: p.grad.clone() for name, p in objective.named_parameters() if p.grad is not None}
    return {k: v.detach().clone() for k, v in output.items()}, grads


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_packed_batch_gives_the_padded_losses_and_gradients(corpus, tmp_path, case, mode):
    objective = build(corpus, tmp_path, case)
    objective.train(mode == "train")
    masked = objective.masker(collate_blocks(mixed_blocks(corpus), corpus.special_ids["pad"]), np.random.default_rng(3))
    gap = getattr(objective.masker, "packing_gap", 0)
    packed = pack_masked(masked, corpus.special_ids["pad"], gap)
    assert packed.input_ids.shape[0] == 1  # one stream
    assert packed.attention_mask.sum() == masked.attention_mask.sum()
    assert packed.input_ids.shape[1] == masked.attention_mask.sum() + gap * (
        len(masked.input_ids) - 1
    )  # no padding but gaps
    padded_out, padded_grads = parameters_gradients(objective, masked.to_torch())
    packed_out, packed_grads = parameters_gradients(objective, packed.to_torch())
    assert padded_out.keys() == packed_out.keys()
    for key in padded_out:
        torch.testing.assert_close(
            packed_out[key].float(), padded_out[key].float(), rtol=1e-4, atol=1e-5, msg=lambda m, key=key: f"{key}: {m}"
        )
    assert padded_grads.keys() == packed_grads.keys() and padded_grads
    for name in padded_grads:
        # Sums over tokens run in another order: a tolerance on the scale of the whole gradient, not of an element.
        scale = float(padded_grads[name].abs().max())
        torch.testing.assert_close(
            packed_grads[name],
            padded_grads[name],
            rtol=1e-3,
            atol=max(1e-3 * scale, 1e-6),
            msg=lambda m, name=name: f"{name}: {m}",
        )


def first_block_batch(masked_ids: np.ndarray, lengths: np.ndarray, mask_id: int) -> MaskedBatch:
    """Blocks (one per row) whose only targets are every third token of block 0 (masked)."""
    attention = np.arange(masked_ids.shape[1])[None, :] < lengths[:, None]
    targets = np.arange(1, lengths[0] - 1, 3)
    ids = masked_ids.copy()
    labels = ids[0, targets].copy()
    ids[0, targets] = mask_id
    return MaskedBatch(
        input_ids=ids,
        attention_mask=attention,
        target_index=targets,
        target_labels=labels,
        target_kind=np.full(len(targets), MASK, dtype=np.int8),
    )


@pytest.mark.parametrize("family", ["bert", "roberta", "electra", "deberta-v2"])
def test_no_information_crosses_blocks(corpus, tmp_path, family):
    """Changing block 2 of a packed stream leaves block 1's hidden states and its MLM loss unchanged."""
    torch.manual_seed(0)
    objective = build_objective(
        recipe("mlm", corpus.directory, tmp_path / "run", f"model.family={family}"), corpus
    ).eval()
    blocks = BlockDataset(corpus, MAX_LEN)
    lengths = blocks.index[:, 1] - blocks.index[:, 0] + 2
    short = np.flatnonzero(lengths <= MAX_LEN // 2)[:3]  # block 1, block 2 and a replacement for block 2
    pad = corpus.special_ids["pad"]
    outputs = []
    for second in short[1:]:
        padded = collate_blocks([blocks[int(short[0])], blocks[int(second)]], pad)
        masked = first_block_batch(padded.input_ids, padded.attention_mask.sum(axis=1), corpus.special_ids["mask"])
        packed = pack_masked(masked, pad)
        batch = packed.to_torch()
        first = torch.from_numpy(
            stream_layout(masked.attention_mask.sum(axis=1)).token_positions()[2][: lengths[short[0]]]
        )
        with torch.no_grad():
            hidden = encoder_states(
                objective.backbone, batch["input_ids"], batch["attention_mask"], batch["position_ids"]
            )
            outputs.append((hidden.flatten(0, 1)[first], objective(batch)["loss"]))
    assert not np.array_equal(blocks[int(short[1])].ids, blocks[int(short[2])].ids)  # block 2 did change
    torch.testing.assert_close(outputs[0][0], outputs[1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outputs[0][1], outputs[1][1], rtol=1e-5, atol=1e-6)


def packed_batch(objective, corpus, blocks, seed: int = 3) -> dict:
    masked = objective.masker(collate_blocks(blocks, corpus.special_ids["pad"]), np.random.default_rng(seed))
    packed = pack_masked(masked, corpus.special_ids["pad"], getattr(objective.masker, "packing_gap", 0))
    return packed.to_torch(objective.batch_fields)


def padded_batch(objective, corpus, blocks, seed: int = 3) -> dict:
    masked = objective.masker(collate_blocks(blocks, corpus.special_ids["pad"]), np.random.default_rng(seed))
    return masked.to_torch(objective.batch_fields)


@pytest.mark.parametrize("layout", ["packed", "padded"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.slow
def test_a_training_step_compiles_as_one_graph_without_breaks(corpus, tmp_path, case, layout):
    objective = build(corpus, tmp_path, case).train()
    accel.apply(objective, torch.device("cpu"), "off", packed=layout == "packed")  # as the trainer does
    batch = (packed_batch if layout == "packed" else padded_batch)(objective, corpus, mixed_blocks(corpus))
    torch._dynamo.reset()
    # The first call: nothing is switched inside the trace. CharBERT's BiGRU traced as one operator, as the loop
    # compiles off the CPU (compile_recurrent_layers).
    explanation = torch._dynamo.explain(compile_recurrent_layers(objective))(batch)
    assert explanation.graph_break_count == 0, [reason.reason for reason in explanation.break_reasons]
    assert explanation.graph_count == 1


@pytest.mark.slow
def test_a_hundred_packed_steps_of_other_widths_compile_at_most_three_times(corpus, tmp_path):
    """Stream width, target counts, segment count and the longest segment change every batch: dynamo makes them
    dynamic after the first change instead of compiling once per value (its limit is 8, then it falls back)."""
    objective = build(corpus, tmp_path, "spanbert").train()
    accel.apply(objective, torch.device("cpu"), "off", packed=True)
    blocks = BlockDataset(corpus, MAX_LEN)
    rng = np.random.default_rng(0)
    torch._dynamo.reset()
    counter = CompileCounter()
    step = torch.compile(objective, backend=counter)
    widths = set()
    for number in range(100):
        picked = rng.choice(len(blocks), size=int(rng.integers(3, 9)), replace=False)
        batch = packed_batch(objective, corpus, [blocks[int(i)] for i in picked], seed=number)
        widths.add((batch["input_ids"].shape[1], batch["max_seq_len"]))
        step(batch)["loss"].backward()
    assert len(widths) > 20  # the batches did differ
    assert counter.frame_count <= 3, counter.frame_count


SYNCING = ("item", "__bool__", "__int__", "__float__", "__index__", "cpu", "tolist", "numpy", "nonzero")


@pytest.mark.parametrize("case", list(CASES))
def test_a_packed_training_step_reads_nothing_on_the_host(corpus, tmp_path, monkeypatch, case):
    """As CUDA's sync debug mode would on a GPU: forward and backward of a packed batch on the accelerator's
    path (here the segments padded again, which like flash's varlen kernel takes the bounds as a tensor and the
    longest as the int the batch carries) read no tensor on the host — DeBERTa-V3's one-segment-per-row
    encoder and ELECTRA's sampling included."""
    objective = build(corpus, tmp_path, case).train()
    accel.apply(objective, torch.device("cpu"), "off", packed=True)
    batch = packed_batch(objective, corpus, mixed_blocks(corpus))
    monkeypatch.setitem(varlen.DEVICE_PATHS, "cpu", "repadded")
    reads = []
    for name in SYNCING:
        original = getattr(torch.Tensor, name)

        def counted(tensor, *args, _name=name, _original=original, **kwargs):
            caller = traceback.extract_stack(limit=2)[0]
            reads.append(f"{_name} in {Path(caller.filename).name}:{caller.lineno}")
            return _original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    objective(batch)["loss"].backward()
    monkeypatch.undo()
    assert not reads, reads


@pytest.mark.parametrize("case", ["spanbert", "deberta-v3-gdes"])
@pytest.mark.slow
def test_a_fullgraph_compiled_packed_step_equals_the_eager_one(corpus, tmp_path, case):
    """torch.compile(fullgraph=True) of a packed training step (on the CPU: the segments padded again inside the
    graph) gives the eager step's losses and gradients (the per-segment loop)."""
    objective = build(corpus, tmp_path, case).train()
    accel.apply(objective, torch.device("cpu"), "off", packed=True)
    batch = packed_batch(objective, corpus, mixed_blocks(corpus))
    eager_out, eager_grads = parameters_gradients(objective, batch)
    torch._dynamo.reset()
    compiled = torch.compile(objective, fullgraph=True, backend="aot_eager")
    compiled_out, compiled_grads = parameters_gradients(compiled, batch)
    compiled_grads = {name.removeprefix("_orig_mod."): grad for name, grad in compiled_grads.items()}
    for key in eager_out:
        torch.testing.assert_close(compiled_out[key].float(), eager_out[key].float(), rtol=1e-4, atol=1e-5)
    assert compiled_grads.keys() == eager_grads.keys() and eager_grads
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-3, atol=1e-5, msg=name)
