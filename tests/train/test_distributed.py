"""The same code path under `torchrun --nproc_per_node 2` (gloo on CPU): DDP and FSDP2, exact resume."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import REPO
from spanlm.config import save_config
from spanlm.train import checkpoint as ckpt
from spanlm.train.metrics import read_metrics
from toy_objective import losses, toy_recipe

pytestmark = pytest.mark.slow  # torchrun process groups


def torchrun(
    recipe_path: Path, *extra: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(REPO / "tests" / "launch_toy.py"),
        "pretrain",
        str(recipe_path),
        *extra,
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    # Every rank releases its process group before the interpreter finalises, after an error too
    # (launch_toy.py reports the threads of one that is still alive at exit).
    assert "gloo threads still running at exit" not in result.stderr, result.stderr[-3000:]
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, settings",
    [
        ("ddp", {}),
        # DDP's bucket views and static graph across micro-batches (no_sync) and recomputed layers
        ("ddp", {"grad_accum": 2, "activation_checkpointing": True}),
        # FSDP2's sharded state saved and resumed, with bf16 all-gathers, fp32 reductions and recomputed layers
        ("fsdp", {"precision": "bf16", "activation_checkpointing": True}),
    ],
    ids=["ddp", "ddp-accum-checkpointed", "fsdp-bf16-checkpointed"],
)
def test_two_processes_resume_exactly(prepared, tmp_path, strategy, settings):
    def recipe(name: str) -> Path:
        path = tmp_path / f"{name}.yaml"
        save_config(
            toy_recipe(
                prepared,
                tmp_path / name,
                max_steps=6,
                save_every=3,
                batch_size=8,
                distributed=strategy,
                eval_every=3,
                **settings,
            ),
            path,
        )
        return path

    torchrun(recipe("full"))
    torchrun(recipe("resumed"), "--resume", str(ckpt.step_dir(tmp_path / "full", 3)))
    full, resumed = losses(tmp_path / "full"), losses(tmp_path / "resumed")
    assert sorted(full) == list(range(1, 7)) and {s: full[s] for s in (4, 5, 6)} == resumed
    a = load_file(str(ckpt.step_dir(tmp_path / "full", 6) / "model.safetensors"))
    b = load_file(str(ckpt.step_dir(tmp_path / "resumed", 6) / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    state = torch.load(ckpt.step_dir(tmp_path / "full", 6) / "trainer_state.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["loaders"]) == 2
    assert (ckpt.step_dir(tmp_path / "full", 6) / "rng-rank1.pt").is_file()
    assert any(r["kind"] == "eval" for r in read_metrics(tmp_path / "full"))


def two_nodes(recipe_path: Path, *extra: str) -> None:
    """``torchrun --nnodes 2`` twice, as two machines would start it: node ranks 0 and 1, one process each,
    meeting at the first node's address (127.0.0.1 here; gloo on CPU); both must exit 0."""
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    launchers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--node_rank",
                str(node),
                "--nproc_per_node",
                "1",
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(port),
                str(REPO / "tests" / "launch_toy.py"),
                "pretrain",
                str(recipe_path),
                *extra,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = []
    try:
        for launcher in launchers:
            outputs.append(launcher.communicate(timeout=300))
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
    for node, (launcher, (_, stderr)) in enumerate(zip(launchers, outputs)):
        assert launcher.returncode == 0, f"node {node}: {stderr[-3000:]}"
        assert "gloo threads still running at exit" not in stderr, stderr[-3000:]


@pytest.mark.slow
def test_two_nodes_train_and_resume_exactly(prepared, tmp_path):
    """docs/distributed.md's multi-node launch, rehearsed on one machine: two launchers of one process each."""

    def recipe(name: str) -> Path:
        path = tmp_path / f"{name}.yaml"
        save_config(toy_recipe(prepared, tmp_path / name, max_steps=4, save_every=2, batch_size=8), path)
        return path

    two_nodes(recipe("full"))
    two_nodes(recipe("resumed"), "--resume", str(ckpt.step_dir(tmp_path / "full", 2)))
    full, resumed = losses(tmp_path / "full"), losses(tmp_path / "resumed")
    assert sorted(full) == [1, 2, 3, 4] and {s: full[s] for s in (3, 4)} == resumed
    a = load_file(str(ckpt.step_dir(tmp_path / "full", 4) / "model.safetensors"))
    b = load_file(str(ckpt.step_dir(tmp_path / "resumed", 4) / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    state = torch.load(ckpt.step_dir(tmp_path / "full", 4) / "trainer_state.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["loaders"]) == 2


@pytest.mark.slow
def test_ranks_train_on_disjoint_blocks(prepared, tmp_path):
    from spanlm.data.blocks import BlockDataset
    from spanlm.data.shards import PreparedCorpus
    from spanlm.pretrain.batches import split_blocks
    from spanlm.train.loader import BatchKeySampler

    train, _ = split_blocks(len(BlockDataset(PreparedCorpus(prepared), 32)), 8, 0)
    seen = []
    for rank in range(2):
        sampler = iter(BatchKeySampler(train, 4, seed=0, rank=rank, world_size=2))
        seen.append({int(i) for _ in range(10) for i in next(sampler)[2]})
    assert not seen[0] & seen[1] and len(seen[0]) == len(seen[1]) == 40


@pytest.mark.slow
def test_only_rank_zero_reports_and_a_tracker_that_cannot_start_stops_every_rank(prepared, tmp_path):
    from mlflow import MlflowClient

    recipe, store = tmp_path / "recipe.yaml", f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = toy_recipe(prepared, tmp_path / "run", max_steps=3, batch_size=8, eval_every=3)
    config.logging.report_to = ["mlflow"]
    save_config(config, recipe)
    refused = torchrun(
        recipe, env={"MLFLOW_TRACKING_URI": "nowhere://tracking"}, check=False
    )  # no rank waits for rank 0
    assert refused.returncode != 0 and "error: logging.report_to: mlflow could not start" in refused.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()

    torchrun(recipe, env={"MLFLOW_TRACKING_URI": store})
    client = MlflowClient(store)
    (found,) = client.search_runs([client.get_experiment_by_name("spanlm").experiment_id])
    assert [m.step for m in client.get_metric_history(found.info.run_id, "train/loss")] == [1, 2, 3]
    assert [m.step for m in client.get_metric_history(found.info.run_id, "eval/loss")] == [3]
