"""Benchmark: how `spanlm prepare` and a run's start-up scale with the corpus, against bare `encode_batch`
and transformers' run_mlm data pipeline.

What is measured, for each corpus size (default 50 and 200 MB), each side in a child process of its own
(so its peak memory is its own) and in this order: spanlm with one process, bare `encode_batch`, the
run_mlm pipeline, spanlm with one single-threaded process, spanlm with two processes (or each count
of ``--processes``), then the pretraining start-up on spanlm's output.

    spanlm      ``spanlm.data.prepare.prepare`` with ``tokenizer.path`` (trained once, untimed, on the first
                megabytes), ``data.num_proc`` 1 and 2 (``--processes``). With one process the tokenizer
                runs on its own thread pool (``TOKENIZERS_PARALLELISM=true``, what ``prepare`` does); each
                worker runs it on one thread. The single-threaded arm is one process confined to one
                thread as a worker is (``TOKENIZERS_PARALLELISM=false``): the unit ``num_proc`` multiplies.
    bare        ``tokenizer.backend_tokenizer.encode_batch(lines, add_special_tokens=False)`` over the
                same lines, 1000 at a time: the tokenizer's own work and nothing else.
    run_mlm     bench/prepare.py's ``run_peer``: run_mlm.py's ``load_dataset("text")`` → ``map(tokenize)``
                → ``map(group_texts)``, into a fresh cache directory.
    start-up    what pretraining does before its model: open the prepared corpus, memory-map the block
                index of ``data.max_len`` (written by prepare), hold out the evaluation blocks, draw the
                first epoch's order; and, separately, building the index of another ``max_len``.

Rates are content tokens per CPU-second of the child and its worker processes (``getrusage``: the
machine is shared, so CPU time rather than wall time); the speed-ups with N processes are tokens per
wall second, np=N over np=1 and np=N over the single-threaded process (how the workers scale: on a
machine with two cores, a single process's thread pool already uses most of both);
``npN_main_cpu_share`` is the main process's part of np=N's CPU (reading, handing out batches, writing:
it bounds the workers one machine can keep busy at about its inverse). Memory: the peak, sampled every
20 ms over the child and its workers, of their proportional shares of heap pages (``Pss_Anon`` from
/proc/PID/smaps_rollup: what grows with the data held; pages that processes share count once) and of
``RssFile`` (file pages mapped or cached, which the kernel may drop; shared libraries count in every
process) from /proc/PID/status. Temporary disk: the peak size of the output's parent directory while
preparing, over the final output's size. ``heap_growth`` = peak heap at the largest size over the
smallest; the extrapolation fits heap = a + b·MB through the two sizes.

Corpora: the English text under ``--data`` (default external/english_text of the repository
root: Gutenberg books and tiny-shakespeare), split into paragraphs at blank lines and written again
and again, the paragraphs reshuffled per copy (``np.random.default_rng([seed, copy])``), into files of
at most 25 MB in a temporary directory; ``--chinese MB`` adds a corpus of the Chinese novels under
``--chinese-data`` prepared with ``data.words=jieba`` in the same arms. Prints one JSON line.

    python bench/prepare_scale.py [--sizes 50 200] [--chinese 10] [--processes 2 4 8] [--small]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
FILE_MB = 25  # corpus files are at most this large
MB = 1 << 20


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[50, 200], help="English corpus sizes in MB")
    parser.add_argument("--chinese", type=float, default=0, help="size in MB of a Chinese (jieba) corpus; 0: none")
    parser.add_argument("--data", default=str(REPO / "external" / "english_text"))
    parser.add_argument("--chinese-data", default=str(REPO / "external" / "chinese_text"))
    parser.add_argument(
        "--no-run-mlm", action="store_true", help="leave out the run_mlm peer (its caches take ~4× the corpus)"
    )
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument(
        "--processes",
        type=int,
        nargs="+",
        default=[2],
        help="data.num_proc values to measure against one process (e.g. 2 4 8 16 on a many-core machine)",
    )
    parser.add_argument(
        "--small", action="store_true", help="tiny sizes (0.3 and 1 MB, 0.2 MB Chinese): a check that it runs"
    )
    parser.add_argument(
        "--work", default=None, help="where the corpora and outputs go (default: a temporary directory)"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-args", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.small:
        args.sizes, args.chinese = [0.3, 1.0], 0.2
    return args


# ---------------------------------------------------------------- corpora


def paragraphs(root: Path) -> list[str]:
    files = sorted(p for p in Path(root).rglob("*.txt") if not p.name.upper().startswith("LICENSE"))
    if not files:
        sys.exit(f"bench/prepare_scale.py: no .txt files under {root}")
    text = "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)
    return [block.strip() for block in text.replace("\r\n", "\n").split("\n\n") if block.strip()]


def write_corpus(source: list[str], megabytes: float, directory: Path, seed: int = 0) -> list[str]:
    """Copies of ``source``'s paragraphs, reshuffled per copy, until ``megabytes``; files of ≤ FILE_MB."""
    directory.mkdir(parents=True)
    target, written, files, copy = int(megabytes * MB), 0, [], 0
    handle = None
    while written < target:
        for index in np.random.default_rng([seed, copy]).permutation(len(source)):
            if handle is None or handle.tell() >= FILE_MB * MB:
                if handle is not None:
                    handle.close()
                files.append(str(directory / f"part-{len(files):04d}.txt"))
                handle = open(files[-1], "w", encoding="utf-8")
            data = source[index] + "\n\n"
            handle.write(data)
            written += len(data.encode("utf-8"))
            if written >= target:
                break
        copy += 1
    handle.close()
    return files


# ---------------------------------------------------------------- measuring a child


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    pids, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as handle:
                    children = [int(c) for c in handle.read().split()]
                pids += children
                frontier += children
        except (FileNotFoundError, ProcessLookupError):
            continue
    return pids


def rss_kb(pid: int) -> tuple[int, int]:
    """``(RssAnon, RssFile)`` of ``pid`` in KB: cheap to read."""
    anon = file = 0
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("RssAnon:"):
                    anon = int(line.split()[1])
                elif line.startswith("RssFile:"):
                    file = int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return anon, file


def heap_share_kb(pid: int) -> int:
    """``Pss_Anon`` of ``pid`` in KB: its proportional share of the heap pages it maps, so pages shared by
    several processes of a tree count once in their sum. (``RssAnon`` counts a worker being spawned twice:
    between its fork and its exec it shares all of its parent's heap.) Reading it walks every mapping of
    the process, so it is read only when the cheap ``RssAnon`` sum could be a new peak."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss_Anon:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def directory_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


class PeakSampler:
    """Peak heap / file-backed RSS of this process tree (every ``every`` seconds) and peak size of ``watch``
    (every tenth sample: walking a directory costs more) while it runs."""

    def __init__(self, watch: Path | None = None, every: float = 0.02):
        self.watch, self.every = watch, every
        self.heap = self.file = self.disk = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, disk: bool) -> None:
        pids = tree(os.getpid())
        sizes = [rss_kb(pid) for pid in pids]
        if sum(a for a, _ in sizes) * 1024 > self.heap:  # Pss_Anon <= RssAnon: only then can the peak grow
            self.heap = max(self.heap, sum(heap_share_kb(pid) for pid in pids) * 1024)
        self.file = max(self.file, sum(f for _, f in sizes) * 1024)
        if disk and self.watch is not None and self.watch.exists():
            self.disk = max(self.disk, directory_bytes(self.watch))

    def _run(self) -> None:
        tick = 0
        while not self.stop.is_set():
            self._sample(disk=tick % 10 == 0)
            tick += 1
            self.stop.wait(self.every)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self._sample(disk=True)


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds of this process and of its (finished) worker processes."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def measured(function, watch: Path | None = None) -> dict:
    """Run ``function()`` (returning a dict with ``tokens``), adding CPU and wall seconds and the peaks.
    ``main_cpu_s`` is this process's share of ``cpu_s``: with workers, the reader's and the writer's."""
    (own, children), wall = cpu_seconds(), time.perf_counter()
    with PeakSampler(watch) as peaks:
        result = function()
    own_after, children_after = cpu_seconds()
    result.update(
        cpu_s=round(own_after - own + children_after - children, 3),
        main_cpu_s=round(own_after - own, 3),
        wall_s=round(time.perf_counter() - wall, 3),
        heap_peak_mb=round(peaks.heap / MB, 1),
        file_peak_mb=round(peaks.file / MB, 1),
    )
    if watch is not None:
        result["disk_peak_mb"] = round(peaks.disk / MB, 2)
    return result


# ---------------------------------------------------------------- the sides (each in a child)


def spanlm_recipe(
    files, prepared: Path, tokenizer: str | None, num_proc: int, words: str, max_len: int, vocab_size: int = 8000
):
    from spanlm.config import from_dict
    from spanlm.pretrain.recipe import Recipe

    return from_dict(
        Recipe,
        {
            "data": {
                "inputs": files,
                "prepared_dir": str(prepared),
                "num_proc": num_proc,
                "words": words,
                "max_len": max_len,
            },
            "tokenizer": {"path": tokenizer}
            if tokenizer
            else {"kind": "wordpiece", "vocab_size": vocab_size, "lowercase": True},
        },
    )


def side_spanlm(files, out: Path, tokenizer: str, num_proc: int, words: str, max_len: int) -> dict:
    from transformers import AutoTokenizer  # noqa: F401  (see below)

    from spanlm.data.prepare import prepare
    from spanlm.data.shards import read_meta

    # transformers' AutoTokenizer is imported before the clock starts, as side_bare imports it (and loads its
    # tokenizer) before its clock: the sides compare their work on the corpus, not the import of transformers.
    out.mkdir(parents=True)
    recipe = spanlm_recipe(files, out / "prepared", tokenizer, num_proc, words, max_len)

    def run():
        prepared = prepare(recipe, force=True, log=lambda message: print(message, file=sys.stderr))
        return {"tokens": int(read_meta(prepared)["n_tokens"]), "output_mb": round(directory_bytes(prepared) / MB, 2)}

    return measured(run, watch=out)


def side_bare(files, tokenizer: str) -> dict:
    from transformers import AutoTokenizer

    backend = AutoTokenizer.from_pretrained(tokenizer).backend_tokenizer

    def run():
        tokens, batch = 0, []
        for path in files:
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    line = line.strip()
                    if line:
                        batch.append(line)
                    if len(batch) == 1000:
                        tokens += sum(len(e.ids) for e in backend.encode_batch(batch, add_special_tokens=False))
                        batch = []
        if batch:
            tokens += sum(len(e.ids) for e in backend.encode_batch(batch, add_special_tokens=False))
        return {"tokens": tokens}

    return measured(run)


def side_run_mlm(files, tokenizer: str, out: Path, block_size: int) -> dict:
    import importlib.util

    import datasets

    datasets.disable_progress_bars()
    spec = importlib.util.spec_from_file_location("bench_prepare", REPO / "bench" / "prepare.py")
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)

    def run():
        tokenized, grouped = peer.run_peer(files, Path(tokenizer), out, block_size, 1)
        content, _, _ = peer.peer_counts(tokenized, grouped)
        return {"tokens": int(content)}

    return measured(run, watch=out)


def side_startup(prepared: str, max_len: int) -> dict:
    """Pretraining's start-up over a prepared corpus (the block index prepared), then another max_len's index."""
    import tempfile as temporary

    from spanlm.data.block_index import share_block_index
    from spanlm.data.blocks import BlockDataset
    from spanlm.data.shards import PreparedCorpus
    from spanlm.pretrain.batches import BlockLengths, split_blocks
    from spanlm.train.loader import BatchKeySampler

    start = time.perf_counter()
    blocks = BlockDataset(PreparedCorpus(prepared), max_len)
    train, _ = split_blocks(len(blocks), 1000, 0)
    next(
        iter(
            BatchKeySampler(
                train, 32, 0, rank=0, world_size=1, lengths=BlockLengths(blocks), tokens_per_batch=32 * max_len
            )
        )
    )
    startup = time.perf_counter() - start
    with temporary.TemporaryDirectory() as scratch:  # another max_len, built into a copy's directory
        copy = Path(scratch) / "copy"
        copy.mkdir()
        for path in Path(prepared).iterdir():
            if path.is_file() and not path.name.startswith("block_index-"):
                (copy / path.name).symlink_to(path)
        start = time.perf_counter()
        share_block_index(PreparedCorpus(copy), 2 * max_len, log=lambda message: print(message, file=sys.stderr))
        build = time.perf_counter() - start
    return {"blocks": len(blocks), "startup_s": round(startup, 3), "other_max_len_index_s": round(build, 3)}


def child_main(kind: str, options: dict) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if kind == "spanlm":
        if options.get("one_thread"):
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        result = side_spanlm(
            options["files"],
            Path(options["out"]),
            options["tokenizer"],
            options["num_proc"],
            options["words"],
            options["max_len"],
        )
    elif kind == "bare":
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
        result = side_bare(options["files"], options["tokenizer"])
    elif kind == "run_mlm":
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
        result = side_run_mlm(options["files"], options["tokenizer"], Path(options["out"]), 512)
    else:
        result = side_startup(options["prepared"], options["max_len"])
    print(json.dumps(result))


def child(kind: str, **options) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--child-args", json.dumps(options)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        sys.exit(f"bench/prepare_scale.py: the {kind} child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- harness


def per_cpu(result: dict) -> float:
    return result["tokens"] / max(result["cpu_s"], 1e-9)


def measure_size(
    files, tokenizer: str, work: Path, name: str, words: str, max_len: int, peers: tuple, processes: list[int]
) -> dict:
    def prepare_with(count: int, one_thread: bool = False) -> dict:
        out = str(work / f"{name}-np{count}{'-one-thread' if one_thread else ''}")
        settings = {"words": words, "max_len": max_len, "one_thread": one_thread}
        return child("spanlm", files=files, out=out, tokenizer=tokenizer, num_proc=count, **settings)

    one = prepare_with(1)
    row = {"tokens": one["tokens"], "spanlm_np1": one}
    if peers:
        row["bare"] = child("bare", files=files, tokenizer=tokenizer)
        row["spanlm_vs_bare"] = round(per_cpu(one) / per_cpu(row["bare"]), 3)
    if peers and "run_mlm" in peers:
        row["run_mlm"] = child("run_mlm", files=files, tokenizer=tokenizer, out=str(work / f"{name}-run_mlm"))
        shutil.rmtree(work / f"{name}-run_mlm", ignore_errors=True)
        row["spanlm_vs_run_mlm"] = round(per_cpu(one) / per_cpu(row["run_mlm"]), 3)
    single = prepare_with(1, one_thread=True)
    shutil.rmtree(work / f"{name}-np1-one-thread", ignore_errors=True)
    row["spanlm_np1_one_thread"] = single
    for count in processes:
        several = prepare_with(count)
        shutil.rmtree(work / f"{name}-np{count}", ignore_errors=True)
        row[f"spanlm_np{count}"] = several
        row[f"np{count}_wall_speedup"] = round(one["wall_s"] / several["wall_s"], 3)
        row[f"np{count}_wall_speedup_over_one_thread"] = round(single["wall_s"] / several["wall_s"], 3)
        # With workers the main process only reads, hands batches out and writes: its share of the CPU
        # bounds how many workers one machine can keep busy (about 1 / share).
        row[f"np{count}_main_cpu_share"] = round(several["main_cpu_s"] / several["cpu_s"], 3)
    row["spanlm_tokens_per_cpu_s"] = round(per_cpu(one))
    row["temp_disk_ratio"] = round(one["disk_peak_mb"] / one["output_mb"], 3)
    row["startup"] = child("startup", prepared=str(work / f"{name}-np1" / "prepared"), max_len=max_len)
    shutil.rmtree(work / f"{name}-np1", ignore_errors=True)
    return row


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        child_main(args.child, json.loads(args.child_args))
        return
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="spanlm-bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    result = {
        "bench": "prepare_scale",
        "sizes_mb": args.sizes,
        "cpus": len(os.sched_getaffinity(0)),
        "max_len": args.max_len,
    }
    try:
        english = paragraphs(Path(args.data))
        corpora = {size: write_corpus(english, size, work / f"corpus-{size:g}mb") for size in args.sizes}
        # The tokenizer, trained once (untimed) on a few megabytes, shared by every side.
        sample = write_corpus(english, min(5.0, args.sizes[0]), work / "tokenizer-sample", seed=1)
        from spanlm.data.prepare import prepare

        tokenizer = str(
            prepare(spanlm_recipe(sample, work / "tokenizer", None, 1, "none", args.max_len), log=lambda *_: None)
            / "tokenizer"
        )
        peers = ("bare",) + (() if args.no_run_mlm else ("run_mlm",))
        result["english"] = {
            f"{size:g}": measure_size(
                corpora[size], tokenizer, work, f"en-{size:g}", "none", args.max_len, peers, args.processes
            )
            for size in args.sizes
        }
        for size in args.sizes:
            shutil.rmtree(work / f"corpus-{size:g}mb", ignore_errors=True)
        small, large = (
            result["english"][f"{size:g}"]["spanlm_np1"]["heap_peak_mb"] for size in (args.sizes[0], args.sizes[-1])
        )
        result["heap_growth"] = round(large / small, 3)
        slope = (large - small) / (args.sizes[-1] - args.sizes[0])
        result["heap_fit_mb"] = {"a": round(small - slope * args.sizes[0], 1), "b_per_mb": round(slope, 4)}
        result["heap_extrapolated_gb"] = {
            f"{gb}GB": round((small + slope * (gb * 1024 - args.sizes[0])) / 1024, 2) for gb in (20, 200)
        }
        if args.chinese:
            chinese = paragraphs(Path(args.chinese_data))
            files = write_corpus(chinese, args.chinese, work / "corpus-zh")
            zh_tokenizer = str(
                prepare(
                    spanlm_recipe(files, work / "zh-tokenizer", None, 1, "none", args.max_len, 8000),
                    log=lambda *_: None,
                )
                / "tokenizer"
            )
            row = measure_size(files, zh_tokenizer, work, "zh", "jieba", args.max_len, (), args.processes)
            english_rate = result["english"][f"{args.sizes[0]:g}"]["spanlm_tokens_per_cpu_s"]
            row["vs_english_per_cpu"] = round(row["spanlm_tokens_per_cpu_s"] / english_rate, 3)
            result["chinese_jieba"] = {f"{args.chinese:g}": row}
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    import tokenizers
    import transformers

    result["versions"] = {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
