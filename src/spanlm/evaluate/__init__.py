"""`spanlm eval`: did pretraining help? A suite of fine-tuning tasks (:mod:`spanlm.evaluate.suite`) run for
several encoders and seeds, one ``spanlm KIND train`` per cell (:mod:`spanlm.evaluate.cells`), judged by paired
differences from a baseline encoder with confidence intervals (:mod:`spanlm.evaluate.verdict`)."""

from __future__ import annotations

from pathlib import Path

from spanlm.errors import ConfigError


def run_suite(
    suite_name: str,
    encoder_specs: list[str],
    out: str | Path,
    seeds: list[int] | None = None,
    baseline: str | None = None,
    jobs: int | None = None,
    force: bool = False,
    log=print,
    settings: dict | None = None,
) -> dict:
    """Run every cell not yet finished, then write the verdict into ``out``; returns results.json's content.

    Everything is checked before the first cell runs: the suite, its recipes and data, the encoders, the
    baseline and the seeds. ``settings`` (dotted keys) are added to every task's (the demo's budgets).
    """
    from spanlm.evaluate.cells import CellRunner, default_jobs, parse_encoders, plan_cells
    from spanlm.evaluate.suite import load_suite
    from spanlm.evaluate.verdict import markdown, verdict, write_report
    from spanlm.files import refuse_to_overwrite_inputs

    suite = load_suite(suite_name, settings)
    encoders = parse_encoders(encoder_specs)
    seeds = tuple(seeds) if seeds else suite.seeds
    if len(set(seeds)) < len(seeds) or any(seed < 0 for seed in seeds):
        raise ConfigError(f"--seeds must name different non-negative seeds, got {list(seeds)}")
    names = [encoder.name for encoder in encoders]
    baseline = baseline or suite.baseline or next((e.name for e in encoders if e.random), names[0])
    if baseline not in names:
        raise ConfigError(f"baseline {baseline!r} is not among the encoders {names}")
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {jobs}")
    default, threads = default_jobs()
    runner = CellRunner(jobs or default, threads if jobs is None else max(1, default // jobs), log)

    out = Path(out)
    # The cells' folders are replaced on a changed setting: no input may live in them, nor OUT in an input.
    refuse_to_overwrite_inputs(out, [suite.path, *(e.path for e in encoders)], "--out", enters=True)
    refuse_to_overwrite_inputs(out / "cells", [e.path for e in encoders], "--out", replaces_directory=True)
    cells = plan_cells(suite, encoders, seeds, out)
    log(
        f"{suite.path}: {len(suite.tasks)} task(s) × {len(encoders)} encoder(s) × arms × {len(seeds)} seed(s) = "
        f"{len(cells)} cells → {out}; baseline {baseline}"
    )
    outcomes = runner.run(cells, force)
    results = verdict(suite, encoders, baseline, seeds, outcomes)
    results["stopped"] = runner.stopped
    written = write_report(results, out)
    log(markdown(results))
    log(f"wrote {', '.join(str(path) for path in written)}")
    return results
