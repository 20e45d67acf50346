"""Doc-stride windows: offsets round trip to the context; targets at the start, the end, across an edge."""

from __future__ import annotations

import numpy as np
import pytest

from spanlm.qa.data import Answer, QAExample
from spanlm.qa.windows import make_windows

CONTEXT = (
    "The lighthouse on Gull Island was built in 1858 by the harbour board. Its lamp was first lit on a "
    "stormy night in October, and the keeper, Martha Lane, kept it burning for forty years."
)
QUESTION = "When was the lighthouse built?"


def example(answer: str | None, start: int | None = None, question: str = QUESTION) -> QAExample:
    if answer is None:
        return QAExample("x", question, CONTEXT, [], [])
    start = CONTEXT.index(answer) if start is None else start
    return QAExample("x", question, CONTEXT, [Answer(answer, start)], [answer])


def span_text(windows, w: int) -> str:
    s, e = windows.start_positions[w], windows.end_positions[w]
    return CONTEXT[windows.offsets[w, s, 0] : windows.offsets[w, e, 1]]


@pytest.mark.parametrize("answer", ["The lighthouse", "forty years.", "Martha Lane"])  # start, end, middle
def test_answer_round_trips_through_every_window_that_holds_it(qa_tokenizer, answer):
    windows = make_windows(qa_tokenizer, [example(answer)], max_length=32, doc_stride=8, max_query_length=16)
    assert len(windows) > 3  # the context really is cut into several windows
    labelled = np.flatnonzero(windows.start_positions)
    assert labelled.size >= 1
    assert all(span_text(windows, w) == answer for w in labelled)
    assert (windows.start_positions <= windows.end_positions).all()
    # A window without the answer targets [CLS]; one that has all of the answer's characters is labelled.
    for w in range(len(windows)):
        chars = windows.offsets[w][windows.context_mask[w]]
        holds = chars[0, 0] <= CONTEXT.index(answer) and CONTEXT.index(answer) + len(answer) <= chars[-1, 1]
        assert bool(windows.start_positions[w]) == holds


def test_answer_across_a_window_edge(qa_tokenizer):
    plain = make_windows(qa_tokenizer, [example(None)], max_length=32, doc_stride=8, max_query_length=16)
    first = plain.offsets[0][plain.context_mask[0]]  # (n, 2) context characters of window 0
    # An answer from window 0's second-to-last context token to two tokens past its edge.
    start, end = int(first[-2, 0]), int(plain.offsets[1][plain.context_mask[1]][first.shape[0] - 8 + 1, 1])
    answer = CONTEXT[start:end]
    windows = make_windows(qa_tokenizer, [example(answer, start)], max_length=32, doc_stride=8, max_query_length=16)
    assert windows.start_positions[0] == 0 and windows.end_positions[0] == 0  # cut by the edge: [CLS]
    assert windows.start_positions[1] > 0 and span_text(windows, 1) == answer  # the next window has all of it


def test_windows_step_by_doc_stride_and_cover_the_context(qa_tokenizer):
    windows = make_windows(qa_tokenizer, [example(None)], max_length=32, doc_stride=8, max_query_length=16)
    context_tokens = [windows.offsets[w][windows.context_mask[w]] for w in range(len(windows))]
    for this, following in zip(context_tokens, context_tokens[1:]):
        np.testing.assert_array_equal(following[0], this[8])  # the next window starts doc_stride tokens later
    assert context_tokens[0][0, 0] == 0 and context_tokens[-1][-1, 1] == len(CONTEXT)
    # Question first: [CLS] question [SEP] context [SEP]; padding beyond each window's length.
    assert (windows.input_ids[:, 0] == qa_tokenizer.cls_token_id).all()
    assert (windows.context_mask <= windows.attention_mask).all()


def test_long_questions_are_cut_to_max_query_length(qa_tokenizer):
    question = "When was the lighthouse on Gull Island built by the harbour board and first lit?"
    windows = make_windows(
        qa_tokenizer, [example("1858", question=question)], max_length=48, doc_stride=16, max_query_length=5
    )
    first_context = int(np.argmax(windows.context_mask[0]))
    assert first_context == 1 + 5 + 1  # [CLS] five question tokens [SEP]


def test_examples_keep_their_windows_in_order(qa_tokenizer):
    # Questions of different lengths are tokenized in separate groups; windows come back by example.
    examples = [example("1858"), example("Martha Lane", question="Who?"), example("forty years.")]
    windows = make_windows(qa_tokenizer, examples, max_length=32, doc_stride=8, max_query_length=16)
    assert (np.diff(windows.example) >= 0).all() and set(windows.example.tolist()) == {0, 1, 2}
    for w in np.flatnonzero(windows.start_positions):
        assert span_text(windows, w) == examples[windows.example[w]].answers[0].text
    batch = windows.batch([0, 1])
    assert batch["input_ids"].shape == batch["context_mask"].shape == (2, int(windows.attention_mask[:2].sum(1).max()))


def test_featurizer_gets_each_windows_ids_offsets_and_context(qa_tokenizer):
    seen = []

    def featurizer(input_ids, offsets, texts):  # stands in for CharBERT's character featurizer
        seen.append((input_ids.shape, offsets.shape, texts))
        return {"char_count": (offsets[..., 1] - offsets[..., 0]).sum(1)}

    examples = [example("1858"), QAExample("y", "Who?", "Martha Lane kept it.", [], [])]
    windows = make_windows(
        qa_tokenizer, examples, max_length=32, doc_stride=8, max_query_length=16, featurizer=featurizer
    )
    last = len(windows) - 1
    batch = windows.batch([0, last])
    ((ids_shape, offsets_shape, texts),) = seen
    assert ids_shape == offsets_shape[:2] == tuple(batch["input_ids"].shape) and texts == [
        CONTEXT,
        "Martha Lane kept it.",
    ]
    # The features cover the context characters of each window: all 20 of the short context.
    assert batch["char_count"][1].item() == len("MarthaLanekeptit.")


def test_the_text_of_a_special_token_is_text_in_questions_and_contexts(qa_tokenizer):
    context = "Its lamp [SEP] was first lit [MASK] on a stormy night."
    windows = make_windows(
        qa_tokenizer,
        [
            QAExample(
                "x",
                "When [SEP] was it lit?",
                context,
                [Answer("a stormy night", context.index("a stormy"))],
                ["a stormy night"],
            )
        ],
        max_length=64,
        doc_stride=16,
        max_query_length=16,
    )
    ids = windows.input_ids[0][windows.attention_mask[0].astype(bool)]
    specials = np.isin(
        ids, list(set(qa_tokenizer.all_special_ids) - {qa_tokenizer.unk_token_id})
    )  # [UNK] may come from text
    assert specials.sum() == qa_tokenizer.num_special_tokens_to_add(pair=True)  # only the template's
    assert (ids[specials] != qa_tokenizer.mask_token_id).all()
    s, e = windows.start_positions[0], windows.end_positions[0]
    assert context[windows.offsets[0, s, 0] : windows.offsets[0, e, 1]] == "a stormy night"
