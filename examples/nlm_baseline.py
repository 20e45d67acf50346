"""Most-frequent-word baseline of the NLM accuracy on a CharBERT run's held-out batches (the engine's eval set)."""

import sys
from collections import Counter

import numpy as np

from spanlm.data.blocks import BlockDataset
from spanlm.data.shards import PreparedCorpus
from spanlm.objectives.charbert.masker import NoiseMasker
from spanlm.pretrain.batches import eval_batches, split_blocks
from spanlm.pretrain.recipe import load_recipe

recipe = load_recipe(sys.argv[1])
corpus = PreparedCorpus(recipe.data.prepared_dir)
blocks = BlockDataset(corpus, recipe.data.max_len)
_, held_out = split_blocks(len(blocks), recipe.train.eval_blocks, recipe.seed)
masker = NoiseMasker.from_corpus(recipe.masking.noise, corpus)
labels = np.concatenate(
    [
        np.asarray(b["nlm_labels"])
        for b in eval_batches(blocks, held_out, masker, recipe.train.batch_size, recipe.seed, 0, 1)
    ]
)
term, count = Counter(labels.tolist()).most_common(1)[0]
print(f"held-out NLM targets {len(labels)}; most frequent word {masker.terms[term]!r}: {count / len(labels):.4f}")
