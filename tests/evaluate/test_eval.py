"""`spanlm eval`: a suite's cells run through `spanlm ner train`, kept when finished, judged with paired intervals."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch
import yaml
from safetensors.torch import load_file

from helpers import REPO
from spanlm.cli import main
from spanlm.errors import ConfigError, InputError
from spanlm.evaluate.stats import paired_bootstrap, paired_difference, t_interval
from spanlm.evaluate.suite import TASK_KINDS, load_suite
from spanlm.pretrain.recipe import load_recipe

FIXTURES = REPO / "tests" / "fixtures" / "ner"
QA_FIXTURES = REPO / "tests" / "fixtures" / "qa"


def test_the_interval_is_scipys_paired_t_interval():
    pretrained = {0: 17.9, 1: 17.1, 2: 18.4, 3: 16.2}
    random = {0: 16.5, 1: 17.3, 2: 16.0, 3: 15.1}
    difference = paired_difference(pretrained, random)
    oracle = scipy.stats.ttest_rel(list(pretrained.values()), list(random.values())).confidence_interval(0.95)
    assert difference.low == pytest.approx(oracle.low) and difference.high == pytest.approx(oracle.high)
    assert difference.mean == pytest.approx(sum(pretrained[s] - random[s] for s in random) / 4)
    assert difference.positive == 3 and difference.n == 4
    assert difference.excludes_zero == (oracle.low > 0 or oracle.high < 0)
    assert t_interval([1.0, 2.0, 4.0], 0.9) == pytest.approx(
        tuple(scipy.stats.ttest_1samp([1.0, 2.0, 4.0], 0).confidence_interval(0.9))
    )


def test_a_difference_pairs_seeds_and_one_seed_has_no_interval():
    assert paired_difference({0: 3.0, 5: 9.0}, {5: 1.0, 7: 0.0}).mean == 8.0  # seed 5 alone is shared
    single = paired_difference({0: 3.0}, {0: 1.0})
    assert single.low is None and single.high is None and not single.excludes_zero
    assert paired_difference({0: 3.0}, {1: 1.0}) is None
    clear = paired_difference({0: 10.0, 1: 11.0, 2: 10.5}, {0: 1.0, 1: 1.2, 2: 0.9})
    assert clear.excludes_zero and clear.low > 0


def test_the_paired_bootstrap_is_scipys_on_a_mean():
    generator = np.random.default_rng(1)
    encoder = generator.normal(60, 20, 400)
    baseline = encoder - generator.normal(2, 5, 400)  # paired: the same questions, mostly better
    low, high = paired_bootstrap(
        lambda sums, n: sums["f1"] / n, {"f1": encoder}, {"f1": baseline}, 20000, generator=generator
    )
    oracle = scipy.stats.bootstrap(
        (encoder, baseline),
        lambda a, b, axis: a.mean(axis) - b.mean(axis),
        paired=True,
        method="percentile",
        n_resamples=20000,
        rng=generator,
    ).confidence_interval
    assert low == pytest.approx(oracle.low, abs=0.05) and high == pytest.approx(oracle.high, abs=0.05)
    assert 0 < low < 2 < high


def test_each_encoder_is_compared_with_its_own_baseline_where_one_is_named(tmp_path, tiny_encoder_dir):
    """Encoders of other architectures each against their own random init, in one verdict."""
    from spanlm.evaluate import _baselines
    from spanlm.evaluate.cells import Outcome, parse_encoders, plan_cells
    from spanlm.evaluate.verdict import markdown, verdict

    suite = load_suite(str(quick_suite(tmp_path)))
    encoders = parse_encoders(
        [f"{name}={'random:' if name.startswith('random') else ''}{tiny_encoder_dir}" for name in
         ("bert", "random", "deberta", "random-deberta")]
    )  # fmt: skip
    baselines = _baselines(["random", "deberta=random-deberta"], None, encoders)
    assert baselines == {"bert": "random", "random": "random", "deberta": "random-deberta", "random-deberta": "random"}
    f1 = {"bert": [50, 52], "random": [40, 41], "deberta": [30, 33], "random-deberta": [35, 35]}
    cells = plan_cells(suite, encoders, (0, 1), tmp_path / "out")
    outcomes = [Outcome(c, {"micro": {"f1": f1[c.encoder.name][c.seed]}}, 1.0) for c in cells]
    results = verdict(suite, encoders, baselines, (0, 1), outcomes)
    rows = {row["encoder"]: row for row in results["tasks"][0]["arms"][0]["encoders"]}
    assert (
        rows["bert"]["difference"]["mean"] == pytest.approx(10.5) and rows["bert"]["difference"]["baseline"] == "random"
    )
    assert rows["deberta"]["difference"]["mean"] == pytest.approx(-3.5)
    assert rows["deberta"]["difference"]["baseline"] == "random-deberta"
    assert "difference" not in rows["random"]
    assert rows["random-deberta"]["difference"]["baseline"] == "random"  # a random init is compared as any other
    assert results["baseline"] == "random" and results["baselines"] == baselines
    table = markdown(results)
    assert "(but deberta − random-deberta)" in table and "| − baseline |" in table and "(− random-deberta)" in table
    # Two baselines for two encoders each: the table names the first encoder's, the other in its rows.
    pairs = {"bert": "random", "random": "random", "deberta": "random-deberta", "random-deberta": "random-deberta"}
    assert "encoder − random (but deberta − random-deberta)" in markdown(
        verdict(suite, encoders, pairs, (0, 1), outcomes)
    )
    # One baseline for all: the table's column names it, as before.
    single = markdown(verdict(suite, encoders, _baselines("random", None, encoders), (0, 1), outcomes))
    assert "| − random |" in single and "(but" not in single
    with pytest.raises(ConfigError, match="name one baseline for all encoders"):
        _baselines(["random", "bert"], None, encoders)


def test_ner_scores_follow_from_the_per_document_counts():
    counts = {"tp": np.array([1, 0, 2]), "n_pred": np.array([2, 1, 2]), "n_gold": np.array([1, 1, 4])}
    sums = {name: values.sum() for name, values in counts.items()}
    metrics = TASK_KINDS["ner"][2]
    assert metrics["f1"][1](sums, 3) == pytest.approx(2 * 3 / (5 + 6) * 100)
    assert metrics["precision"][1](sums, 3) == pytest.approx(60.0) and metrics["recall"][1](sums, 3) == 50.0
    assert metrics["precision"][1]({"tp": np.array(0), "n_pred": np.array(0)}, 3) == 0.0  # no prediction


def quick_suite(tmp_path: Path, **changes) -> Path:
    suite = {
        "seeds": [0, 1],
        "tasks": [
            {
                "name": "wnut-mini",
                "kind": "ner",
                "recipe": str(REPO / "configs/ner/wnut17.yaml"),
                "metric": "f1",
                "arms": ["fine-tuned"],
                "settings": {
                    "data.train": str(FIXTURES / "wnut_train_mini.conll"),
                    "data.dev": str(FIXTURES / "wnut_dev_mini.conll"),
                    "data.max_len": 32,
                    "data.stride": 8,
                    "train.max_steps": 2,
                    "train.batch_size": 4,
                    "train.eval_every": 2,
                    "train.save_every": 2,
                    "train.log_every": 1,
                    "train.num_workers": 0,
                    "train.device": "cpu",
                },
            }
        ],
    }
    suite["tasks"][0]["settings"].update(changes)
    path = tmp_path / "suite.yaml"
    path.write_text("# A quick suite: two NER steps\n" + yaml.safe_dump(suite), encoding="utf-8")
    return path


def run_eval(arguments: list[str], capsys) -> tuple[int, dict | None, str]:
    code = main(["eval", *arguments])
    captured = capsys.readouterr()
    out = json.loads(captured.out) if captured.out.strip() else None
    return code, out, captured.err


@pytest.fixture(scope="module")
def evaluated(tiny_encoder_dir, tmp_path_factory):
    """One quick suite run: a tiny encoder against its random init, two seeds, two cells at a time."""
    tmp_path = tmp_path_factory.mktemp("eval")
    suite = quick_suite(tmp_path)
    out = tmp_path / "out"
    arguments = [
        str(suite), "--encoders", f"tiny={tiny_encoder_dir}", f"random=random:{tiny_encoder_dir}",
        "--out", str(out), "--jobs", "2",
    ]  # fmt: skip
    assert main(["eval", *arguments]) == 0
    return suite, out, arguments


def test_every_cell_runs_and_the_verdict_pairs_each_encoder_with_the_baseline(evaluated, tiny_encoder_dir):
    suite, out, _ = evaluated
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["baseline"] == "random"  # the random: encoder, unless named
    cells = {(c["task"], c["encoder"], c["arm"], c["seed"]) for c in results["cells"] if "score" in c}
    assert cells == {("wnut-mini", e, "fine-tuned", s) for e in ("tiny", "random") for s in (0, 1)}
    for cell in results["cells"]:
        run = Path(cell["directory"]) / "run"
        assert cell["score"] == json.loads((run / "eval.json").read_text(encoding="utf-8"))["micro"]["f1"]
        recipe = yaml.safe_load((Path(cell["directory"]) / "recipe.yaml").read_text(encoding="utf-8"))
        assert recipe["seed"] == cell["seed"] and recipe["model"]["path"] == str(tiny_encoder_dir)
        assert recipe["model"]["init"] == ("random" if cell["encoder"] == "random" else "pretrained")
        assert (run / "model").is_dir()  # the same model directory `spanlm ner train` exports
        per_document = json.loads((run / "per_example.json").read_text(encoding="utf-8"))
        sums = {name: np.asarray(values).sum() for name, values in per_document.items()}
        assert TASK_KINDS["ner"][2]["f1"][1](sums, len(per_document["tp"])) == pytest.approx(cell["score"])
    (arm,) = results["tasks"][0]["arms"]
    rows = {row["encoder"]: row for row in arm["encoders"]}
    scores = {name: {int(s): v for s, v in rows[name]["seeds"].items()} for name in rows}
    assert rows["tiny"]["difference"]["interval"] == "t over 2 seeds"
    assert rows["tiny"]["difference"]["mean"] == pytest.approx(
        sum(scores["tiny"][s] - scores["random"][s] for s in (0, 1)) / 2
    )
    assert "difference" not in rows["random"]
    assert set(results["overall"]["fine-tuned"]) == {"tiny", "random"}
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "wnut-mini (ner, f1), fine-tuned" in report and "| tiny |" in report
    assert "<table>" in (out / "report.html").read_text(encoding="utf-8")


def test_a_rerun_keeps_finished_cells_and_runs_only_what_changed(evaluated, tmp_path, capsys):
    suite, out, arguments = evaluated
    code, _, err = run_eval(arguments, capsys)
    assert code == 0 and "4 of 4 cells already finished" in err and "running" not in err
    # A longer seed list runs only the new seeds' cells and pools every seed in the verdict.
    code, _, err = run_eval([*arguments, "--seeds", "0", "1", "2"], capsys)
    assert code == 0 and "4 of 6 cells already finished" in err and "running 2 cells" in err
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    tiny = next(row for row in results["tasks"][0]["arms"][0]["encoders"] if row["encoder"] == "tiny")
    assert sorted(tiny["seeds"]) == ["0", "1", "2"] and tiny["difference"]["n"] == 3
    # A cell stopped before its end (no final scores) runs again alone, continuing its run.
    stopped = out / "cells/wnut-mini/tiny/fine-tuned/seed-1/run/eval.json"
    stopped.unlink()
    code, _, err = run_eval(arguments, capsys)
    assert code == 0 and "3 of 4 cells already finished" in err and "[1/1] wnut-mini/tiny/fine-tuned/seed-1" in err
    assert stopped.is_file()
    # A changed setting reruns the cells it changes (here: every cell of seed 0, the seeds asked for).
    changed = [str(quick_suite(tmp_path, **{"train.lr": 1.23e-3})), *arguments[1:], "--seeds", "0"]
    code, _, err = run_eval(changed, capsys)
    assert code == 0 and "running 2 cells" in err and "already finished" not in err
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    tiny = next(row for row in results["tasks"][0]["arms"][0]["encoders"] if row["encoder"] == "tiny")
    assert tiny["difference"]["interval"] == "paired bootstrap over the dev examples"  # one seed
    assert tiny["difference"]["low"] <= tiny["difference"]["mean"] <= tiny["difference"]["high"]
    # A failing cell is reported, and the others go on (here: kept).
    broken = tmp_path / "broken"
    broken.mkdir()
    # a model config, so it passes the check; training fails on it (no weights)
    (broken / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    code, printed, err = run_eval([*changed, "--encoders", f"broken={broken}"], capsys)  # added to the two
    assert code == 1 and printed["failed"] == 1 and "2 of 3 cells already finished" in err and "FAILED" in err
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    statuses = {cell["encoder"]: cell.get("status", "scored") for cell in results["cells"]}
    assert statuses == {"tiny": "scored", "random": "scored", "broken": "failed"}
    failed = next(cell for cell in results["cells"] if cell["encoder"] == "broken")
    assert (Path(failed["directory"]) / "log.txt").is_file() and failed["error"].startswith("exit ")


def test_a_cell_is_the_same_under_another_spelling_of_out_or_of_its_encoders_path(
    tiny_encoder_dir, tmp_path, monkeypatch
):
    """A relative or absolute --out, or encoder path, names the same cells (kept on a rerun); another encoder
    directory, even a copy with the same files and times, is another cell."""
    from spanlm.evaluate.cells import parse_encoders, plan_cells

    suite = load_suite(str(quick_suite(tmp_path)))
    monkeypatch.chdir(tiny_encoder_dir.parent)

    def fingerprint(encoder: Path, out: Path) -> str:
        (cell,) = plan_cells(suite, parse_encoders([f"tiny={encoder}"]), (0,), out)
        return cell.fingerprint()

    relative = Path(tiny_encoder_dir.name)
    assert fingerprint(tiny_encoder_dir, tmp_path / "out") == fingerprint(
        relative, Path(os.path.relpath(tmp_path / "out"))
    )
    copy = shutil.copytree(tiny_encoder_dir, tmp_path / "copy")  # the same names, sizes and modification times
    assert fingerprint(copy, tmp_path / "out") != fingerprint(tiny_encoder_dir, tmp_path / "out")


def test_an_edited_training_or_dev_file_makes_another_cell(tiny_encoder_dir, tmp_path):
    """A task's data file edited in place is another cell, run again on a rerun, not a finished one kept with scores
    of the old data; the same data written again (a study's script) is the same cell."""
    from spanlm.evaluate.cells import parse_encoders, plan_cells

    train, dev = tmp_path / "train.conll", tmp_path / "dev.conll"
    shutil.copy(FIXTURES / "wnut_train_mini.conll", train)
    shutil.copy(FIXTURES / "wnut_dev_mini.conll", dev)
    suite = load_suite(str(quick_suite(tmp_path, **{"data.train": str(train), "data.dev": str(dev)})))

    def fingerprint() -> str:
        (cell,) = plan_cells(suite, parse_encoders([f"tiny={tiny_encoder_dir}"]), (0,), tmp_path / "out")
        return cell.fingerprint()

    before = fingerprint()
    for edited in (train, dev):
        stat, text = edited.stat(), edited.read_text(encoding="utf-8")
        edited.write_text(text, encoding="utf-8")
        os.utime(edited, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        assert fingerprint() == before  # written again, the same data
        edited.write_text(text.replace("O\n", "O \n", 1), encoding="utf-8")
        assert fingerprint() != before
        before = fingerprint()


@pytest.mark.parametrize("stopping", [True, False])
def test_a_cell_ended_by_the_suites_stop_as_it_starts_is_not_run_not_failed(stopping, tiny_encoder_dir, tmp_path):
    """A stop that reaches a cell before its run handles signals kills it (exit -15): not run, as a cell the stop
    kept from starting; the same exit without a stop is a failure."""
    import signal

    from spanlm.evaluate.cells import CellRunner, parse_encoders, plan_cells
    from spanlm.evaluate.verdict import verdict

    suite = load_suite(str(quick_suite(tmp_path)))
    encoders = parse_encoders([f"tiny={tiny_encoder_dir}"])
    (cell,) = plan_cells(suite, encoders, (0,), tmp_path / "out")
    runner = CellRunner(1, 1, log=lambda *_: None)

    class Killed:  # a cell's process the SIGTERM ends while it starts
        pid = 1

        def wait(self):
            runner.stopped = "SIGTERM" if stopping else None
            return -signal.SIGTERM

    def start(cell, command, stdout=None):
        (cell.directory / "log.txt").write_text("Terminated\n", encoding="utf-8")
        return Killed()

    runner._start = start
    outcome = runner._run_one(cell, force=False)
    (record,) = verdict(suite, encoders, {"tiny": "tiny"}, (0,), [outcome])["cells"]
    assert record["status"] == ("not run" if stopping else "failed")
    assert (outcome.error is None) == stopping


def test_the_html_report_keeps_every_row_but_the_tables_header_rule():
    from spanlm.evaluate.verdict import _page

    page = _page("# Suite\n\n| encoder | f1 |\n|---|:---:|\n| my---enc | 1.00 |\n| --- | 2.00 |", "", {})
    assert "<th>encoder</th>" in page and "<td>my---enc</td><td>1.00</td>" in page and "<td>---</td>" in page
    assert page.count("<tr>") == 3


@pytest.mark.parametrize(
    "case, expected",
    [
        ("unknown-kind", "unknown kind 'summarisation'"),
        ("missing-encoder", "no such directory"),
        ("same-name", "each encoder needs its own name"),
        ("missing-data", "data.dev"),
        ("unknown-setting", "unknown config key 'train.max_stepz'"),
        ("unknown-baseline", "baseline 'nobody' is not among the encoders"),
        ("unknown-own-baseline", "baseline 'nobody' is not among the encoders"),
        ("out-is-an-encoder", "--out is the input"),
        ("encoder-in-the-cells", "--out holds the input"),
        ("windows-beyond-positions", "exceeds the"),
        ("metric-not-scored", "metric cluener_macro_f1: its runs do not score it on"),
        ("same-name-in-two-options", "each encoder needs its own name, ['tiny'] repeat"),
        ("seeds-in-two-options", "--seeds must name different non-negative seeds, got [0, 1, 0]"),
        ("baselines-in-two-options", "name one baseline for all encoders, got ['tiny', 'random']"),
        ("seeds-true", "seeds must be a list of one or more non-negative integers, got [True]"),
        ("encoder-config-not-json", "config.json:1:2: not valid JSON"),
        ("encoder-config-a-list", "config.json: not a Hugging Face model config (a JSON object with a 'model_type')"),
        ("encoder-config-no-model-type", "config.json: not a Hugging Face model config"),
        ("recipe-not-yaml", "recipe.yaml:2: not valid YAML (mapping values are not allowed here)"),
        ("recipe-not-shipped", "suite.yaml: task wnut-mini: no recipe named 'ner/wnut71'"),
        ("recipe-not-a-mapping", "recipe.yaml: a recipe is a mapping of sections, got list"),
        ("kind-a-list", "unknown kind ['ner']"),
        ("metric-a-list", "metric is one of ['cluener_macro_f1', 'f1', 'precision', 'recall'], got ['f1']"),
        ("arms-of-lists", "arms must list one or both of ['fine-tuned', 'frozen'], got [['fine-tuned']]"),
    ],
)
def test_bad_input_stops_before_any_cell_runs(case, expected, tiny_encoder_dir, tmp_path, capsys):
    suite = quick_suite(tmp_path)
    raw = yaml.safe_load(suite.read_text(encoding="utf-8"))
    encoders = [f"tiny={tiny_encoder_dir}", f"random=random:{tiny_encoder_dir}"]
    extra = []
    if case == "unknown-kind":
        raw["tasks"][0]["kind"] = "summarisation"
    elif case == "missing-encoder":
        encoders[1] = f"random=random:{tmp_path / 'nowhere'}"
    elif case == "same-name":
        encoders[1] = f"tiny=random:{tiny_encoder_dir}"
    elif case == "missing-data":
        raw["tasks"][0]["settings"]["data.dev"] = str(tmp_path / "dev.conll")
    elif case == "unknown-setting":
        raw["tasks"][0]["settings"]["train.max_stepz"] = 3
    elif case == "unknown-baseline":
        extra = ["--baseline", "nobody"]
    elif case == "unknown-own-baseline":
        extra = ["--baseline", "random", "tiny=nobody"]
    elif case == "out-is-an-encoder":
        extra = ["--out", str(tiny_encoder_dir)]
    elif case == "encoder-in-the-cells":
        inside = tmp_path / "out" / "cells" / "encoder"
        inside.mkdir(parents=True)
        (inside / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
        encoders[1] = f"random=random:{inside}"
    elif case == "windows-beyond-positions":
        positions = json.loads((tiny_encoder_dir / "config.json").read_text(encoding="utf-8"))
        positions = positions["max_position_embeddings"] - (positions["pad_token_id"] + 1) * (
            positions["model_type"] == "roberta"
        )
        raw["tasks"][0]["settings"]["data.max_len"] = positions + 1
        expected = f"data.max_len {positions + 1} exceeds the {positions} positions of encoder tiny"
    elif case == "recipe-not-shipped":
        raw["tasks"][0]["recipe"] = "ner/wnut71"
    elif case in ("recipe-not-yaml", "recipe-not-a-mapping"):
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text("data:\n  train: a: b\n" if case == "recipe-not-yaml" else "- data\n", encoding="utf-8")
        raw["tasks"][0]["recipe"] = str(recipe)
    elif case in ("kind-a-list", "metric-a-list", "arms-of-lists"):
        key = case.split("-")[0]
        raw["tasks"][0][key] = [raw["tasks"][0][key]]
    elif case.startswith("encoder-config-"):
        broken = tmp_path / "broken"
        broken.mkdir()
        config = {"not-json": "{oops", "a-list": "[]", "no-model-type": '{"hidden_size": 32}'}[case[15:]]
        (broken / "config.json").write_text(config, encoding="utf-8")
        encoders[1] = f"random=random:{broken}"
        expected = f"--encoders random=random:{broken}: {broken / 'config.json'}" + expected[len("config.json") :]
    elif case == "same-name-in-two-options":  # --encoders given twice: both lists
        encoders[1:] = ["--encoders", f"tiny=random:{tiny_encoder_dir}"]
    elif case == "seeds-in-two-options":
        extra = ["--seeds", "0", "1", "--seeds", "0"]
    elif case == "baselines-in-two-options":
        extra = ["--baseline", "tiny", "--baseline", "random"]
    elif case == "seeds-true":  # YAML's true, which Python counts as the integer 1
        raw["seeds"] = [True]
    elif case == "metric-not-scored":  # CLUENER's macro F1 of data in another format
        raw["tasks"][0]["metric"] = "cluener_macro_f1"
    suite.write_text(yaml.safe_dump(raw), encoding="utf-8")
    code, out, err = run_eval([str(suite), "--encoders", *encoders, "--out", str(tmp_path / "out"), *extra], capsys)
    assert code == 2 and out is None
    assert len(err.strip().splitlines()) == 1 and expected in err and "Traceback" not in err
    assert not (tmp_path / "out").exists() or case == "encoder-in-the-cells"
    assert not list(tiny_encoder_dir.glob("results.json")) and not (tiny_encoder_dir / "cells").exists()


def test_a_cls_metric_its_recipe_does_not_score_is_refused_before_any_cell_runs(tmp_path):
    """A cls task scores its recipe's cls.metrics, else its benchmark's (SST-2: accuracy alone), else by its problem;
    a metric beyond them would be found missing only once every cell had run."""

    def load(metric: str, **settings):
        task = {"name": "sst2", "kind": "cls", "recipe": "cls/sst2", "metric": metric, "settings": settings}
        task["settings"] |= {
            "data.train": str(REPO / "data/cls/sst2/dev.tsv"),
            "data.dev": str(REPO / "data/cls/sst2/dev.tsv"),
        }
        (path := tmp_path / "suite.yaml").write_text(yaml.safe_dump({"tasks": [task]}), encoding="utf-8")
        return load_suite(str(path))

    for metric in ("f1", "matthews", "pearson"):
        with pytest.raises(ConfigError, match=f"task sst2: metric {metric}: its runs do not score it on .* accuracy"):
            load(metric)
    (task,) = load("f1", **{"cls.metrics": ["accuracy", "f1"], "cls.positive_label": "1"}).tasks
    assert task.score({"accuracy": 50.0, "f1": 40.0}) == 40.0
    # Scores without the metric (a run of another recipe): the task and metric named, not a KeyError
    with pytest.raises(ConfigError, match=r"task sst2: its runs' scores hold no f1 \(they hold \['accuracy'\]\)"):
        task.score({"accuracy": 50.0})


@pytest.mark.parametrize("name", sorted(path.stem for path in (REPO / "configs/eval").glob("*.yaml")))
def test_every_shipped_suite_reads_with_its_data_present(name, capsys):
    suite = load_suite(name)
    assert suite.description and suite.tasks
    assert main(["recipes", "list"]) == 0
    assert f"eval/{name} " in capsys.readouterr().out


def test_the_shipped_demo_suite_is_the_demos_comparison():
    suite = load_suite("demo")
    (task,) = suite.tasks
    assert task.kind == "ner" and task.arms == ("fine-tuned", "frozen") and task.metric == "f1"
    assert task.recipe.data.train_docs == 500 and task.recipe.train.max_steps == 300
    assert Path(task.recipe.data.train).is_file() and Path(task.recipe.data.train).is_absolute()
    # Windows that the demo's default encoder, CharBERT (64 positions), can number: the suite runs on its export
    charbert = load_recipe(REPO / "configs/pretrain/charbert.yaml")
    assert task.recipe.data.max_len == charbert.model.max_position_embeddings == 64


@pytest.mark.parametrize("given", [None, "", " "])
def test_a_cell_runs_one_thread_unless_omp_num_threads_is_set(given, monkeypatch):
    from spanlm.evaluate.cells import cell_environment

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    if given is not None:  # an empty value is no setting: OpenMP would take every core in every cell
        monkeypatch.setenv("OMP_NUM_THREADS", given)
    assert cell_environment(1)["OMP_NUM_THREADS"] == "1"
    assert cell_environment(None).get("OMP_NUM_THREADS") == given  # on a GPU: left as it is
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cell_environment(1)["OMP_NUM_THREADS"] == "3"


def test_cls_accuracy_follows_from_the_per_example_column():
    correct = np.array([1, 0, 1, 1])
    assert TASK_KINDS["cls"][2]["accuracy"][1]({"correct": correct.sum()}, 4) == pytest.approx(75.0)
    assert TASK_KINDS["cls"][2]["matthews"][1] is None  # no per-example formula: no bootstrap interval


@pytest.mark.slow
def test_a_cls_suite_runs_its_cells(tiny_encoder_dir, tmp_path, capsys):
    suite = {
        "seeds": [0],
        "tasks": [
            {
                "name": "sst2-mini",
                "kind": "cls",
                "recipe": "cls/sst2",
                "metric": "accuracy",
                "arms": ["fine-tuned"],
                "settings": {
                    "data.train": str(REPO / "data/cls/sst2/dev.tsv"),
                    "data.dev": str(REPO / "data/cls/sst2/dev.tsv"),
                    "data.max_length": 32,
                    "train.max_steps": 2,
                    "train.warmup_steps": 0,
                    "train.batch_size": 8,
                    "train.eval_every": 2,
                    "train.save_every": 2,
                    "train.num_workers": 0,
                    "train.device": "cpu",
                },
            }
        ],
    }
    path = tmp_path / "suite.yaml"
    path.write_text("# SST-2 in two steps\n" + yaml.safe_dump(suite), encoding="utf-8")
    encoders = [f"tiny={tiny_encoder_dir}", f"random=random:{tiny_encoder_dir}"]
    code, out, err = run_eval([str(path), "--encoders", *encoders, "--out", str(tmp_path / "out")], capsys)
    assert code == 0, err
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    cells = [c for c in results["cells"] if c["task"] == "sst2-mini"]
    assert len(cells) == 2 and all(0 <= c["score"] <= 100 for c in cells)


@pytest.mark.slow
def test_an_interrupted_cell_resumed_scores_what_it_would_have_scored(tiny_encoder_dir, tmp_path, capsys):
    """A cell stopped after its first checkpoint (its final checkpoint, model and scores not written) continues from
    that checkpoint when the suite runs again, and ends with the uninterrupted cell's scores, to the last digit."""
    suite = quick_suite(tmp_path, **{"train.max_steps": 4, "train.save_every": 2, "train.eval_every": 4})
    out = tmp_path / "out"
    arguments = [str(suite), "--encoders", f"tiny={tiny_encoder_dir}", f"random=random:{tiny_encoder_dir}"]
    arguments += ["--out", str(out), "--jobs", "1", "--seeds", "0"]
    assert run_eval(arguments, capsys)[0] == 0
    cell = out / "cells/wnut-mini/tiny/fine-tuned/seed-0/run"
    uninterrupted = json.loads((cell / "eval.json").read_text(encoding="utf-8"))
    weights = load_file(str(cell / "model" / "model.safetensors"))
    # what a stop after step 2 leaves: step 2's checkpoint, no final checkpoint, model or scores
    from spanlm.train import checkpoint as ckpt

    shutil.rmtree(ckpt.step_dir(cell, 4))
    shutil.rmtree(cell / "model")
    (cell / "eval.json").unlink()
    code, _, err = run_eval(arguments, capsys)
    assert code == 0 and "1 of 2 cells already finished" in err
    resumed = json.loads((cell / "eval.json").read_text(encoding="utf-8"))
    assert resumed == uninterrupted  # every count of the dev scores (here: the same 234 predicted spans)
    again = load_file(str(cell / "model" / "model.safetensors"))
    assert again.keys() == weights.keys() and all(torch.equal(again[k], weights[k]) for k in weights)


def test_keep_predictions_writes_each_cells_dev_predictions_finished_cells_too(evaluated, capsys):
    """--keep-predictions: each scored cell's dev predictions, the lines `spanlm ner eval --predictions` writes (one
    document a line, every entity with its score), beside the cell's scores; cells finished earlier get theirs."""
    suite, out, arguments = evaluated
    code, _, err = run_eval([*arguments, "--keep-predictions"], capsys)
    assert code == 0 and "cells already finished" in err, err  # (which: as the tests before left the cells)
    dev_documents = [line for line in (FIXTURES / "wnut_dev_mini.conll").read_text().split("\n\n") if line.strip()]
    for cell in json.loads((out / "results.json").read_text(encoding="utf-8"))["cells"]:
        lines = (Path(cell["directory"]) / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
        assert len(lines) == len(dev_documents) and all("entities" in json.loads(line) for line in lines)


@pytest.mark.slow
def test_a_test_split_is_scored_by_each_cells_final_model_and_reported_beside_dev(tiny_encoder_dir, tmp_path, capsys):
    """A task's ``test``: each cell's exported model scored on it (``spanlm ner eval``: CELL/test.json), tabled as
    ``TASK (test)`` with the same seeds and differences (no bootstrap: no per-example test scores); a suite that
    gains a test split keeps its finished cells and scores their models."""
    suite = quick_suite(tmp_path)
    raw = yaml.safe_load(suite.read_text(encoding="utf-8"))
    out = tmp_path / "out"
    arguments = [str(suite), "--encoders", f"tiny={tiny_encoder_dir}", f"random=random:{tiny_encoder_dir}"]
    arguments += ["--out", str(out), "--seeds", "0"]
    assert run_eval(arguments, capsys)[0] == 0
    raw["tasks"][0]["test"] = str(FIXTURES / "wnut_train_mini.conll")
    suite.write_text(yaml.safe_dump(raw), encoding="utf-8")
    code, _, err = run_eval(arguments, capsys)
    assert code == 0 and "2 of 2 cells already finished" in err
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [(t["task"], t["split"]) for t in results["tasks"]] == [("wnut-mini", "dev"), ("wnut-mini (test)", "test")]
    for cell in results["cells"]:
        test = json.loads((Path(cell["directory"]) / "test.json").read_text(encoding="utf-8"))
        assert test["data"] == raw["tasks"][0]["test"] and cell["test_score"] == test["micro"]["f1"]
    rows = {r["encoder"]: r for r in results["tasks"][1]["arms"][0]["encoders"]}
    assert rows["tiny"]["seeds"]["0"] == next(c["test_score"] for c in results["cells"] if c["encoder"] == "tiny")
    assert rows["tiny"]["difference"]["interval"] is None  # one seed, no per-example test scores
    assert "## wnut-mini (test) (ner, f1), fine-tuned" in (out / "report.md").read_text(encoding="utf-8")
    # Another test split: the kept cells' models scored on it, not the earlier split's scores reported under it
    raw["tasks"][0]["test"] = str(FIXTURES / "wnut_dev_mini.conll")
    suite.write_text(yaml.safe_dump(raw), encoding="utf-8")
    code, _, err = run_eval(arguments, capsys)
    assert code == 0 and "2 of 2 cells already finished" in err
    for cell in json.loads((out / "results.json").read_text(encoding="utf-8"))["cells"]:
        test = json.loads((Path(cell["directory"]) / "test.json").read_text(encoding="utf-8"))
        assert test["data"] == raw["tasks"][0]["test"] and cell["test_score"] == test["micro"]["f1"]


@pytest.mark.parametrize(
    "kind, recipe, metric, data",
    [
        ("cls", "cls/sst2", "accuracy", {"data.train": str(REPO / "data/cls/sst2/dev.tsv"), "data.max_length": 32}),
        (
            "ner",
            "ner/wnut17",
            "f1",
            {"data.train": str(FIXTURES / "wnut_train_mini.conll"), "data.max_len": 32, "data.stride": 8},
        ),
        (
            "qa",
            "qa/squad",
            "f1",
            {
                "data.train": str(QA_FIXTURES / "squad_v2_sample.json"),
                "data.max_length": 64,
                "data.max_query_length": 16,
                "data.doc_stride": 32,
            },
        ),
    ],
)
def test_a_pretrained_encoder_and_its_random_twin_start_with_the_same_head(
    kind, recipe, metric, data, tiny_encoder_dir, tmp_path
):
    """The paired comparison's promise: two encoders with the same seed draw the same initial head, though building
    the random encoder draws from torch's generator first."""
    import importlib

    from spanlm.evaluate.cells import Cell, Encoder
    from spanlm.train.dist import DistEnv

    suite = {"tasks": [{"name": kind, "kind": kind, "recipe": recipe, "metric": metric, "settings": data}]}
    suite["tasks"][0]["settings"] |= {"data.dev": data["data.train"], "train.device": "cpu", "train.batch_size": 4}
    (path := tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite), encoding="utf-8")
    (task,) = load_suite(str(path)).tasks
    setup = getattr(importlib.import_module(f"spanlm.{kind}.task"), f"{kind}_setup")
    heads = []
    for random in (False, True):
        cell = Cell(task, Encoder("e", tiny_encoder_dir, random), "fine-tuned", 3, tmp_path / str(random))
        heads.append(setup(cell.recipe(), DistEnv(), log=lambda *_: None).objective.head.state_dict())
    pretrained, fresh = heads
    assert pretrained.keys() == fresh.keys() and all(torch.equal(pretrained[k], fresh[k]) for k in pretrained)


@pytest.mark.slow
def test_a_qa_cells_predictions_are_json_lines(tiny_encoder_dir, tmp_path, capsys):
    """--keep-predictions for QA: predictions.jsonl holds one {"id", "answer"} line per dev question (qa eval's
    --predictions is one JSON object, the official scripts' input)."""
    squad = QA_FIXTURES / "squad_v2_sample.json"
    settings = {"data.train": str(squad), "data.dev": str(squad), "data.max_length": 64, "data.max_query_length": 16}
    settings |= {"data.doc_stride": 32, "train.max_steps": 2, "train.batch_size": 4, "train.warmup_steps": 0}
    settings |= {"train.eval_every": 0, "train.save_every": 2, "train.num_workers": 0, "train.device": "cpu"}
    task = {"name": "squad-mini", "kind": "qa", "recipe": "qa/squad", "metric": "f1", "settings": settings}
    (suite := tmp_path / "suite.yaml").write_text(yaml.safe_dump({"seeds": [0], "tasks": [task]}), encoding="utf-8")
    arguments = [str(suite), "--encoders", f"tiny={tiny_encoder_dir}", "--out", str(tmp_path / "out")]
    code, _, err = run_eval([*arguments, "--keep-predictions"], capsys)
    assert code == 0, err
    (cell,) = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))["cells"]
    lines = [json.loads(line) for line in (Path(cell["directory"]) / "predictions.jsonl").read_text().splitlines()]
    questions = [q["id"] for a in json.loads(squad.read_text())["data"] for p in a["paragraphs"] for q in p["qas"]]
    assert [line["id"] for line in lines] == questions and all(isinstance(line["answer"], str) for line in lines)


def test_a_directory_named_like_a_shipped_suite_does_not_hide_it(tmp_path, monkeypatch):
    """`spanlm eval english-small --out english-small`, run again from the same directory: the name is the shipped
    suite's, not the earlier run's output folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "english-small").mkdir()
    assert [task.name for task in load_suite("english-small").tasks] == ["wnut17", "sst2"]
    (tmp_path / "mine").mkdir()  # a directory that names no shipped suite is still read as the path given
    with pytest.raises(InputError, match="mine"):
        load_suite("mine")
