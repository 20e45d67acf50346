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
    baseline: str | list[str] | None = None,
    jobs: int | None = None,
    force: bool = False,
    log=print,
    settings: dict | None = None,
    keep_predictions: bool = False,
) -> dict:
    """Run every cell not yet finished, then write the verdict into ``out``; returns results.json's content.

    Everything is checked before the first cell runs: the suite, its recipes and data, the encoders (and that
    every task's windows fit in their positions), the baselines and the seeds. ``baseline`` is one encoder's
    name, compared against by every other encoder, or a list of such a name and ``ENCODER=NAME`` pairs for
    encoders with a baseline of their own (encoders of other architectures, each against its own random
    init). ``settings`` (dotted keys) are added to every task's (the demo's budgets). ``keep_predictions``: each
    scored cell's dev predictions in its folder (``predictions.jsonl``), for checks outside spanlm.
    """
    from spanlm.evaluate.cells import CellRunner, check_windows, default_jobs, parse_encoders, plan_cells
    from spanlm.evaluate.suite import load_suite
    from spanlm.evaluate.verdict import markdown, verdict, write_report
    from spanlm.files import guard_outputs

    suite = load_suite(suite_name, settings)
    encoders = parse_encoders(encoder_specs)
    check_windows(suite, encoders)
    seeds = tuple(seeds) if seeds else suite.seeds
    if len(set(seeds)) < len(seeds) or any(seed < 0 for seed in seeds):
        raise ConfigError(f"--seeds must name different non-negative seeds, got {list(seeds)}")
    baselines = _baselines(baseline, suite.baseline, encoders)
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {jobs}")
    default, threads = default_jobs()
    runner = CellRunner(jobs or default, threads if jobs is None else max(1, default // jobs), log, keep_predictions)

    out = Path(out)
    # The cells' folders are replaced on a changed setting: no input may live in them, nor OUT in an input.
    guard_outputs({"--out": out}, {"the suite": suite.path, "--encoders": [e.path for e in encoders]})
    cells = plan_cells(suite, encoders, seeds, out)
    log(
        f"{suite.path}: {len(suite.tasks)} task(s) × {len(encoders)} encoder(s) × arms × {len(seeds)} seed(s) = "
        f"{len(cells)} cells → {out}; baseline {_describe(baselines)}"
    )
    outcomes = runner.run(cells, force)
    results = verdict(suite, encoders, baselines, seeds, outcomes)
    results["stopped"] = runner.stopped
    written = write_report(results, out)
    log(markdown(results))
    log(f"wrote {', '.join(str(path) for path in written)}")
    return results


def _baselines(given: str | list[str] | None, suite_baseline: str | None, encoders) -> dict[str, str]:
    """Each encoder's baseline: the one ``ENCODER=NAME`` gives it, else the one plain name given (else the
    suite's, else the first ``random:`` encoder, else the first encoder). A baseline is its own."""
    names = [encoder.name for encoder in encoders]
    given = [given] if isinstance(given, str) else list(given or [])
    plain = [name for name in given if "=" not in name]
    if len(plain) > 1:
        raise ConfigError(f"--baseline: name one baseline for all encoders, got {plain} (ENCODER=NAME for others)")
    default = (plain or [suite_baseline or next((e.name for e in encoders if e.random), names[0])])[0]
    own = dict(pair.split("=", 1) for pair in given if "=" in pair)
    for name in [default, *own, *own.values()]:
        if name not in names:
            raise ConfigError(f"baseline {name!r} is not among the encoders {names}")
    return {name: own.get(name, default) for name in names}


def _describe(baselines: dict[str, str]) -> str:
    """ "random", or "random (charbert: random-charbert, …)" where some encoders have their own."""
    from spanlm.evaluate.verdict import most_common_baseline

    default = most_common_baseline(baselines)
    own = [f"{name}: {base}" for name, base in baselines.items() if base != default and name != base]
    return default + (f" ({', '.join(own)})" if own else "")
