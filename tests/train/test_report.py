"""The run report's figures: no panel mixes counts with losses, loss parts never share a panel."""

from spanlm.report import panels


def test_each_loss_has_its_own_panel_rates_share_one_and_counts_are_never_drawn():
    keys = ["loss", "mlm_loss", "sbo_loss", "mlm_accuracy", "sbo_accuracy", "rtd_precision", "n_mlm", "n_sbo", "lr"]
    layout = dict(panels(keys))
    assert layout["loss"] == ["loss"] and layout["mlm_loss"] == ["mlm_loss"] and layout["sbo_loss"] == ["sbo_loss"]
    assert layout["accuracy / precision / recall / F1"] == ["mlm_accuracy", "sbo_accuracy", "rtd_precision"]
    assert layout["lr"] == ["lr"]
    drawn = [key for panel in layout.values() for key in panel]
    assert "n_mlm" not in drawn and "n_sbo" not in drawn
    for panel in layout.values():  # a panel is all losses, all rates, or one other value
        kinds = {
            "loss"
            if key.endswith("loss")
            else "rate"
            if any(w in key for w in ("accuracy", "precision", "f1"))
            else key
            for key in panel
        }
        assert len(kinds) == 1


def test_a_figure_of_counts_only_is_not_drawn():
    assert panels(["n_mlm", "n_sbo"]) == []


def test_the_unigram_baseline_comes_from_the_runs_kept_corpus_counts_without_specials(tmp_path):
    import json

    import numpy as np

    from spanlm.report import unigram_accuracy, write_report

    kept = tmp_path / "tokenizers" / "abc123"
    kept.mkdir(parents=True)
    np.save(
        kept / "token_counts.npy", np.array([1000, 0, 30, 50, 20], dtype=np.int64)
    )  # id 0: [PAD]-like special, most frequent
    (kept / "meta.json").write_text(json.dumps({"all_special_ids": [0, 1]}))
    assert unigram_accuracy(tmp_path) == 50 / 100
    records = [
        {"kind": "train", "step": 1, "loss": 7.0},
        {"kind": "eval", "step": 1, "loss": 7.0, "mlm_accuracy": 0.2, "n_mlm": 10},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write_report(tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["eval"]["unigram_accuracy"] == 0.5
    assert "unigram_accuracy" in (tmp_path / "report.html").read_text()
    assert unigram_accuracy(tmp_path / "elsewhere") is None  # a run without a kept tokenizer: no baseline


def test_a_phased_runs_boundaries_are_marked_between_two_phases_within_the_steps_drawn(tmp_path):
    """A dotted line between the last step of a phase and the first of the next (4.5: step 4 is the first phase's),
    only where the records reach, so that a run stopped in its first phases keeps its scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from spanlm.pretrain.phases import plan
    from spanlm.pretrain.recipe import load_recipe
    from spanlm.report import mark_phases

    recipe = load_recipe(
        None, ["train.schedule=wsd", "phases=[{name: a, steps: 4}, {name: b, steps: 3}, {name: c, steps: 3}]"]
    )
    figure, (whole, stopped) = plt.subplots(1, 2)
    mark_phases(whole, plan(recipe), last_step=10)
    mark_phases(stopped, plan(recipe), last_step=5)
    assert [line.get_xdata()[0] for line in whole.lines] == [4.5, 7.5]
    assert [text.get_text().strip() for text in whole.texts] == ["b", "c"]
    assert [line.get_xdata()[0] for line in stopped.lines] == [4.5]
    plt.close(figure)
