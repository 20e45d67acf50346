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
