"""`spanlm recipes list / copy`, and the recipes and embedded data as installed from a wheel."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from helpers import REPO, doc_section
from spanlm.cli import main
from spanlm.errors import InputError
from spanlm.recipes import shipped_root, with_embedded_data_paths


def recipes_listed(capsys) -> dict[str, str]:
    assert main(["recipes", "list"]) == 0
    return dict(line.split(maxsplit=1) for line in capsys.readouterr().out.splitlines())


def test_a_checkout_ships_its_own_configs_and_data():
    assert shipped_root() == REPO


def test_list_names_every_recipe_with_what_it_is(capsys):
    listed = recipes_listed(capsys)
    assert set(listed) == {
        path.relative_to(REPO / "configs").with_suffix("").as_posix() for path in (REPO / "configs").rglob("*.yaml")
    }
    assert listed["pretrain/spanbert"] == "SpanBERT (Joshi et al. 2020, arXiv 1907.10529)"
    assert (
        listed["prepare/english"]
        == "Prepare the embedded public-domain English corpus (data/corpus) with a new WordPiece tokenizer"
    )
    assert listed["masking/macbert"].endswith("on the embedded Chinese text")  # the colon ending the line is cut too


def test_copy_makes_the_embedded_data_paths_absolute_and_keeps_the_rest(tmp_path, capsys):
    assert main(["recipes", "copy", "pretrain/spanbert", str(tmp_path / "my.yaml")]) == 0
    assert json.loads(capsys.readouterr().out) == {"recipe": "pretrain/spanbert", "copied": str(tmp_path / "my.yaml")}
    original = yaml.safe_load((REPO / "configs/pretrain/spanbert.yaml").read_text(encoding="utf-8"))
    copied = yaml.safe_load((tmp_path / "my.yaml").read_text(encoding="utf-8"))
    corpus = [REPO / path for path in original["data"]["inputs"]]
    assert copied["data"]["inputs"] == [path.as_posix() for path in corpus] and all(path.is_file() for path in corpus)
    copied["data"]["inputs"] = original["data"]["inputs"]
    assert copied == original  # outputs (runs/...) stay relative to the working directory
    header = (tmp_path / "my.yaml").read_text(encoding="utf-8").split("\nseed:")[0]
    assert header == (REPO / "configs/pretrain/spanbert.yaml").read_text(encoding="utf-8").split("\nseed:")[0]


def test_copy_into_a_directory_keeps_the_recipe_file_name(tmp_path, capsys):
    assert main(["recipes", "copy", "ner/wnut17", str(tmp_path)]) == 0
    assert main(["recipes", "copy", "qa/squad.yaml", str(tmp_path / "new") + "/"]) == 0  # a directory to create
    capsys.readouterr()
    wnut17 = yaml.safe_load((tmp_path / "wnut17.yaml").read_text(encoding="utf-8"))
    assert wnut17["data"]["train"] == (REPO / "data/ner/wnut17/train.conll").as_posix()
    assert wnut17["model"]["path"] == "runs/export/spanbert"
    assert (tmp_path / "new/squad.yaml").read_text(encoding="utf-8") == (REPO / "configs/qa/squad.yaml").read_text(
        encoding="utf-8"
    )


def test_copy_replaces_an_existing_file_only_with_force(tmp_path, capsys):
    mine = tmp_path / "my.yaml"
    mine.write_text("seed: 7\n", encoding="utf-8")
    assert main(["recipes", "copy", "pretrain/mlm", str(mine)]) == 2
    assert capsys.readouterr().err == f"spanlm recipes: error: {mine}: already exists (--force replaces it)\n"
    assert mine.read_text(encoding="utf-8") == "seed: 7\n"
    assert main(["recipes", "copy", "pretrain/mlm", str(mine), "--force"]) == 0
    assert yaml.safe_load(mine.read_text(encoding="utf-8"))["objective"]["name"] == "mlm"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["my.yaml"]  # no partial file left behind


@pytest.mark.parametrize(
    ("name", "close"),
    [
        (
            "spanbert",
            "masking/spanbert, pretrain/spanbert, pretrain/ettin_spanbert, pretrain/modernbert_spanbert, "
            "pretrain/spanbert_chinese",
        ),
        ("pretrain/spanbret", "pretrain/spanbert"),
    ],
)
def test_an_unknown_name_is_one_line_naming_close_ones(tmp_path, capsys, name, close):
    assert main(["recipes", "copy", name, str(tmp_path / "my.yaml")]) == 2
    error = capsys.readouterr().err
    assert (
        error.startswith(f"spanlm recipes: error: no recipe named '{name}' (close names: ") and error.count("\n") == 1
    )
    assert close in error
    assert not (tmp_path / "my.yaml").exists()


def test_a_name_like_none_points_at_the_list(tmp_path, capsys):
    assert main(["recipes", "copy", "zzzz", str(tmp_path / "my.yaml")]) == 2
    assert (
        capsys.readouterr().err
        == "spanlm recipes: error: no recipe named 'zzzz' (`spanlm recipes list` shows them all)\n"
    )


def embedded_root(root: Path) -> Path:
    (root / "data/corpus").mkdir(parents=True)
    (root / "data/corpus/alice.txt").write_text("Alice.\n", encoding="utf-8")
    return root


def test_only_paths_into_the_embedded_data_are_rewritten(tmp_path):
    root = embedded_root(tmp_path / "my data")  # a space is plain YAML
    text = (
        "# see data/corpus/alice.txt and ../other/data/corpus/alice.txt\n"
        "data:\n  inputs: [data/corpus/alice.txt, data/corpus/missing.txt, runs/data/corpus/alice.txt]\n"
    )
    rewritten = with_embedded_data_paths(text, root)
    assert (
        rewritten.splitlines()[0] == f"# see {root.as_posix()}/data/corpus/alice.txt and ../other/data/corpus/alice.txt"
    )
    assert yaml.safe_load(rewritten)["data"]["inputs"] == [
        (root / "data/corpus/alice.txt").as_posix(),
        "data/corpus/missing.txt",
        "runs/data/corpus/alice.txt",
    ]


@pytest.mark.parametrize("directory", ["a, b", "a #b", "a: b"])
def test_a_data_path_yaml_would_misread_is_refused(tmp_path, directory):
    root = embedded_root(tmp_path / directory)
    with pytest.raises(InputError, match="YAML cannot hold this path unquoted"):
        with_embedded_data_paths("data:\n  inputs: [data/corpus/alice.txt]\n", root)


# docs/recipes.md's commands, made small: the same tokenizer for both (so pretrain reuses the prepared corpus).
TINY = {
    "prepare": ["tokenizer.vocab_size=500"],
    "pretrain": [
        "tokenizer.vocab_size=500",
        "model.hidden_size=32",
        "model.num_layers=1",
        "model.num_heads=2",
        "model.intermediate_size=64",
        "train.max_steps=2",
        "train.eval_every=0",
        "train.num_workers=0",
        "logging.progress=false",
    ],
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from an sdist of the checkout, as a release is (so MANIFEST.in is exercised too)."""
    out = tmp_path_factory.mktemp("dist")
    env = {
        **os.environ,
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }  # offline: the venv's setuptools builds
    sdist = subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.build_sdist({str(out)!r}))"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()[-1]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(out / sdist),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    (wheel,) = out.glob("spanlm-*.whl")
    return wheel


def test_an_installed_wheel_runs_the_documented_commands_from_anywhere(wheel, tmp_path):
    site, work = tmp_path / "site", tmp_path / "work"
    work.mkdir()
    # -S: the venv's .pth files are not read, so the editable install's path to this checkout's src/ is not
    # on sys.path; the dependencies come from the venv's site-packages, spanlm only from `site`.
    dependencies = sysconfig.get_paths()["purelib"]
    env = {
        **os.environ,
        "PYTHONPATH": f"{site}{os.pathsep}{dependencies}",
        "SPANLM_NATIVE": "0",  # no kernel build
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    python = [sys.executable, "-S"]
    without_site = subprocess.run(
        [*python, "-c", "import spanlm"],
        cwd=work,
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": dependencies},
    )
    assert "No module named 'spanlm'" in without_site.stderr  # nothing of the checkout is importable

    ran = []
    for line in doc_section("docs/recipes.md", "Recipes from an installed package", language="bash")[0].splitlines():
        words = shlex.split(line, comments=True)
        if words == ["pip", "install", "spanlm"]:
            command = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel)]
        elif words[:1] == ["spanlm"]:
            command = [*python, "-m", "spanlm", *words[1:], *TINY.get(words[1], [])]
        else:
            raise AssertionError(f"docs/recipes.md: a command this test cannot run: {line}")
        result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"{line}\n{result.stderr[-3000:]}"
        ran.append((words[:2], result))
    assert [words for words, _ in ran] == [
        ["pip", "install"],
        ["spanlm", "recipes"],
        ["spanlm", "recipes"],
        ["spanlm", "prepare"],
        ["spanlm", "pretrain"],
    ]

    share = site / "spanlm" / "share"
    tracked = subprocess.run(
        ["git", "ls-files", "configs", "data"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert sorted(path.relative_to(share).as_posix() for path in share.rglob("*") if path.is_file()) == sorted(tracked)
    assert all((share / path).read_bytes() == (REPO / path).read_bytes() for path in tracked)

    listing, copying, preparing, pretraining = (result for _, result in ran[1:])
    listed = dict(line.split(maxsplit=1) for line in listing.stdout.splitlines())
    assert listed["pretrain/spanbert"] == "SpanBERT (Joshi et al. 2020, arXiv 1907.10529)" and len(listed) == len(
        list(share.rglob("*.yaml"))
    )
    assert f"recipes in {share / 'configs'}" in listing.stderr
    assert json.loads(copying.stdout) == {"recipe": "pretrain/spanbert", "copied": "my_spanbert.yaml"}
    inputs = yaml.safe_load((work / "my_spanbert.yaml").read_text(encoding="utf-8"))["data"]["inputs"]
    assert inputs == [
        (share / "data/corpus" / name).as_posix()
        for name in ("alice_in_wonderland.txt", "adventures_of_sherlock_holmes.txt", "frankenstein.txt")
    ]
    prepared = json.loads(preparing.stdout)
    assert (prepared["n_documents"], prepared["vocab_size"]) == (3, 500)
    assert (
        work / prepared["prepared_dir"]
    ).resolve() == work / "runs/prepared/english-wordpiece-500"  # keyed by its tokenizer
    assert (work / json.loads(pretraining.stdout)["run_dir"]).resolve() == work / "runs/pretrain/spanbert"
    assert "reusing it" in pretraining.stderr
    assert [
        json.loads(line)["step"] for line in (work / "runs/pretrain/spanbert/metrics.jsonl").read_text().splitlines()
    ][-1] == 2
