"""A full disk (here a real file-size limit: RLIMIT_FSIZE, so writes fail with EFBIG as on a full or
quota-bound disk) while writing a checkpoint, a prepared corpus, an export or predictions: a one-line
error naming what could not be written, exit code 2, the previous one intact, no temporary files."""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spanlm.pretrain.run import pretrain
from spanlm.train import checkpoint as ckpt
from toy_objective import toy_recipe

pytestmark = pytest.mark.slow  # training runs and subprocesses on a size-limited disk

TESTS = Path(__file__).parents[1]
LIMIT = 30_000  # bytes per file: below the toy's weights, the corpus's token ids and the predictions written here


def limited(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``spanlm ARGS`` (the toy objective registered) in a process that may write no file past LIMIT bytes."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))

    script = (
        f"import sys; sys.path.insert(0, {str(TESTS)!r}); import toy_objective; "
        "from spanlm.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    # Without the native kernels: a rebuild of them (a new source) would itself hit the limit, and warn.
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        cwd=cwd,
        env={**os.environ, "SPANLM_NATIVE": "0"},
    )


def tree_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(directory)).encode() + path.read_bytes())
    return digest.hexdigest()


def one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and lines, result.stderr
    assert all(fragment in lines[-1] for fragment in fragments), lines[-1]
    assert "error:" in lines[-1] and [line for line in lines if "error" in line] == [lines[-1]]


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*") if ".tmp-" in p.name or ".old-" in p.name)


def test_a_checkpoint_on_a_full_disk(prepared, tmp_path):
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), log=lambda *_: None)
    before = tree_digest(ckpt.step_dir(run, 2))
    result = limited("pretrain", str(run / "config.yaml"), "train.max_steps=3", "--resume", "auto", cwd=tmp_path)
    one_line_error(
        result,
        "step-0000003: could not write the checkpoint (File too large)",
        f"the latest checkpoint {ckpt.step_dir(run, 2)} is intact",
    )
    assert tree_digest(ckpt.step_dir(run, 2)) == before and ckpt.latest_checkpoint(run) == ckpt.step_dir(run, 2)
    assert leftovers(run) == []


def test_after_a_full_disk_resume_auto_continues_from_the_last_whole_checkpoint(prepared, tmp_path):
    """The disk fills during the step-4 save; once there is space again, `--resume auto` continues from step 2
    and the run is the one an uninterrupted run would have been (the same losses, the same weights)."""
    from safetensors.torch import load_file

    from toy_objective import losses

    quiet = {"log": lambda *_: None}
    whole = pretrain(toy_recipe(prepared, tmp_path / "whole", max_steps=6, save_every=2), **quiet)
    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2, save_every=2), **quiet)
    full = limited("pretrain", str(run / "config.yaml"), "train.max_steps=6", "--resume", "auto", cwd=tmp_path)
    one_line_error(full, "step-0000002", "could not write the checkpoint", "is intact")
    assert ckpt.latest_checkpoint(run) == ckpt.step_dir(run, 2) and leftovers(run) == []

    messages = []  # space again: the same command
    pretrain(toy_recipe(prepared, run, max_steps=6, save_every=2), resume="auto", log=messages.append)
    assert any(f"resumed from {ckpt.step_dir(run, 2)} at step 2" in m for m in messages)
    assert losses(run) == losses(whole)
    final, expected = (load_file(ckpt.step_dir(r, 6) / "model.safetensors") for r in (run, whole))
    assert final.keys() == expected.keys() and all((final[k] == expected[k]).all() for k in final)


def test_a_prepared_corpus_on_a_full_disk(prepared, tmp_path):
    import shutil

    corpus = tmp_path / "prepared"
    shutil.copytree(prepared, corpus)
    before = tree_digest(corpus)
    result = limited("prepare", str(prepared / "config.yaml"), f"data.prepared_dir={corpus}", "--force", cwd=tmp_path)
    one_line_error(result, f"{corpus}: could not be written (File too large); the previous {corpus} is intact")
    assert tree_digest(corpus) == before and leftovers(tmp_path) == []


def test_an_export_on_a_full_disk(prepared, tmp_path):
    from spanlm.pretrain.export import export_checkpoint

    run = pretrain(toy_recipe(prepared, tmp_path / "run", max_steps=2), log=lambda *_: None)
    out = export_checkpoint(run, tmp_path / "export")
    before = tree_digest(out)
    result = limited("export", str(run), "--out", str(out), cwd=tmp_path)
    one_line_error(result, f"{out}: could not be written (File too large); the previous {out} is intact")
    assert tree_digest(out) == before and leftovers(tmp_path) == []
    fresh = tmp_path / "fresh"
    one_line_error(limited("export", str(run), "--out", str(fresh), cwd=tmp_path), "nothing was written")
    assert not fresh.exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("existing", [True, False])
def test_predictions_on_a_full_disk(tmp_path, existing):
    output = tmp_path / "predictions.jsonl"
    if existing:
        output.write_text('{"earlier": true}\n')
    script = (
        "import sys; from spanlm.cli_support import write_lines_or_stdout; from spanlm.errors import InputError\n"
        "try:\n    write_lines_or_stdout(['{\"id\": %d}\\n' % i for i in range(10000)], sys.argv[1], 'documents')\n"
        "except InputError as error:\n    print(error); sys.exit(2)"
    )

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))

    result = subprocess.run(
        [sys.executable, "-c", script, str(output)], capture_output=True, text=True, preexec_fn=limit
    )
    assert result.returncode == 2, result.stderr
    kept = f"the previous {output} is intact" if existing else "nothing was written"
    assert result.stdout.strip() == f"{output}: could not be written (File too large); {kept}"
    assert (output.read_text() == '{"earlier": true}\n') if existing else not output.exists()
    assert [p.name for p in tmp_path.iterdir()] == (["predictions.jsonl"] if existing else [])
