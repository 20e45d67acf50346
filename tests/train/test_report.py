"""The run report's figures: no panel mixes counts with losses, loss parts never share a panel."""

from spanlm.train.report import panels


def test_each_loss_has_its_own_panel_rates_share_one_and_counts_are_never_drawn():
    keys = ["loss", "mlm_loss", "sbo_loss", "mlm_accuracy", "sbo_accuracy", "rtd_precision", "n_mlm", "n_sbo", "lr"]
    layout = dict(panels(keys))
    assert layout["loss"] == ["loss"] and layout["mlm_loss"] == ["mlm_loss"] and layout["sbo_loss"] == ["sbo_loss"]
    assert layout["accuracy / precision / recall / F1"] == ["mlm_accuracy", "sbo_accuracy", "rtd_precision"]
    assert layout["lr"] == ["lr"]
    drawn = [key for panel in layout.values() for key in panel]
    assert "n_mlm" not in drawn and "n_sbo" not in drawn
    for panel in layout.values():  # a panel is all losses, all rates, or one other value
        kinds = {"loss" if key.endswith("loss") else "rate" if any(w in key for w in ("accuracy", "precision", "f1")) else key for key in panel}
        assert len(kinds) == 1


def test_a_figure_of_counts_only_is_not_drawn():
    assert panels(["n_mlm", "n_sbo"]) == []
