"""spanlm.accel.native: the compiled kernels give the PyTorch path's results (dropout bit for bit, the
cross-entropy to float rounding), and spanlm falls back to that path where they cannot be built."""

import os

import pytest
import torch

from helpers import dropout_multiplier
from spanlm import accel
from spanlm.accel import dropout, native
from spanlm.heads import TiedDecoder, VocabTarget, vocab_cross_entropies
from spanlm.heads.losses import IGNORE_INDEX


@pytest.fixture
def kernels():
    module = native.kernels()
    if module is None:
        pytest.skip("spanlm's native kernels cannot be built on this machine")
    return module


@pytest.mark.parametrize("numel", [0, 1, 3, 4, 5, 4 * 256 + 1, 300_001])
@pytest.mark.parametrize("p", [2**-16, 0.1, 0.5, 1 - 2**-16])
def test_dropout_decisions_are_the_splitmix64_reference_bit_for_bit(kernels, numel, p):
    levels = round(p * 65536)
    for kept in (1.0, 65536 / (65536 - levels)):
        threshold = levels - 32768
        x = torch.randn(numel)
        x[::7] = float("nan")  # x · 0 stays NaN, as with the multiplier
        out = torch.empty_like(x)
        kernels.dropout_apply(x, out, 12345, threshold, kept)
        expected = x * dropout_multiplier(x.shape, 12345, threshold, kept)
        assert torch.equal(out.isnan(), expected.isnan())
        assert torch.equal(out.nan_to_num(), expected.nan_to_num())


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_forward_and_backward_apply_one_multiplier(kernels, monkeypatch, p):
    monkeypatch.setattr(dropout, "_stream_key", lambda: 777)
    x = torch.randn(7, 11, 13, generator=torch.Generator().manual_seed(1)).transpose(0, 1).requires_grad_()
    out = dropout.fast_dropout(x, p)  # a non-contiguous input
    upstream = torch.arange(out.numel(), dtype=torch.float32).view(out.shape)
    out.backward(upstream)
    _, threshold, kept = dropout.dropout_stream(p)
    multiplier = dropout_multiplier(x.shape, 777, threshold, kept)
    assert torch.equal(out, x.detach() * multiplier) and torch.equal(x.grad, upstream * multiplier)


def test_dropout_apply_on_strided_views_and_in_place(kernels):
    """The fused attention's case: probabilities stored (heads, B, L, L), decisions in (B, heads, L, L) order."""
    heads, batch, length = 3, 2, 5
    stored = torch.randn(heads, batch, length, length)
    expected = stored.transpose(0, 1).contiguous() * dropout_multiplier((batch, heads, length, length), 99, -20000)
    out = torch.empty_like(stored)
    kernels.dropout_apply(stored.transpose(0, 1), out.transpose(0, 1), 99, -20000, 1.0)
    assert torch.equal(out.transpose(0, 1), expected)
    kernels.dropout_apply(stored.transpose(0, 1), stored.transpose(0, 1), 99, -20000, 1.0)  # in place
    assert torch.equal(stored, out)
    with pytest.raises(RuntimeError, match="last dimension must be dense"):
        kernels.dropout_apply(stored.transpose(2, 3), out.transpose(2, 3), 99, -20000, 1.0)


def _logits_case(rows=37, vocab=1003, ignored=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    embedding = torch.nn.Embedding(vocab, 16)
    torch.nn.init.normal_(embedding.weight, std=2.0, generator=generator)
    decoder = TiedDecoder(embedding)
    torch.nn.init.normal_(decoder.bias, generator=generator)
    features = torch.randn(rows, 16, generator=generator, requires_grad=True)
    labels = torch.randint(0, vocab, (rows,), generator=generator)
    labels[torch.randperm(rows, generator=generator)[:ignored]] = IGNORE_INDEX
    return embedding, decoder, features, labels


@pytest.mark.parametrize("vocab", [1003, 16 * 64 * 3 + 7, 50])  # tails after the vector loop and the sum's chunks
def test_the_fused_cross_entropy_gives_the_plain_results(kernels, vocab):
    results = []
    for fused in (False, True):
        embedding, decoder, features, labels = _logits_case(vocab=vocab)
        if fused:
            accel.apply(decoder, torch.device("cpu"))
        (loss,) = vocab_cross_entropies([VocabTarget(features, decoder, labels)])
        (loss.total * 0.37).backward()
        results.append((loss.total, loss.correct, features.grad, embedding.weight.grad, decoder.bias.grad))
    reference, compiled = results
    torch.testing.assert_close(compiled[0], reference[0], atol=1e-5, rtol=1e-6)
    assert compiled[1].item() == reference[1].item()
    for got, expected in zip(compiled[2:], reference[2:]):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_cross_entropy_rows_in_place_on_a_row_range(kernels):
    logits = torch.randn(9, 70) * 3
    bias, labels = torch.randn(70), torch.randint(0, 70, (9,))
    valid = torch.tensor([True] * 7 + [False] * 2)
    losses, hits, bias_grad = torch.full((9,), -1.0), torch.zeros(9, dtype=torch.bool), torch.zeros(70)
    rows = logits.clone()
    kernels.softmax_cross_entropy_rows(rows, bias, labels, valid, losses, hits, bias_grad, 2, 9)
    shifted = logits + bias
    probabilities = torch.softmax(shifted, dim=-1)
    expected_loss = torch.nn.functional.cross_entropy(shifted, labels, reduction="none") * valid
    gradient = (probabilities - torch.nn.functional.one_hot(labels, 70)) * valid[:, None]
    assert torch.equal(rows[:2], logits[:2]) and torch.equal(losses[:2], torch.full((2,), -1.0))  # outside the range
    torch.testing.assert_close(losses[2:], expected_loss[2:])
    torch.testing.assert_close(rows[2:], gradient[2:])
    torch.testing.assert_close(bias_grad, gradient[2:].sum(0))
    assert torch.equal(hits[2:], (shifted.argmax(-1) == labels)[2:] & valid[2:])
    # without a bias gradient: losses and hits only
    again, again_hits = torch.empty(9), torch.zeros(9, dtype=torch.bool)
    kernels.softmax_cross_entropy_rows(logits.clone(), bias, labels, valid, again, again_hits, None, 0, 9)
    torch.testing.assert_close(again[2:], losses[2:], atol=0, rtol=0)


def test_cross_entropy_rows_keep_a_nan_visible_and_refuse_bad_labels(kernels):
    logits, bias = torch.randn(3, 40), torch.zeros(40)
    logits[1, 17] = float("nan")
    valid = torch.ones(3, dtype=torch.bool)
    losses, hits = torch.empty(3), torch.empty(3, dtype=torch.bool)
    kernels.softmax_cross_entropy_rows(
        logits, bias, torch.tensor([0, 1, 2]), valid, losses, hits, torch.zeros(40), 0, 3
    )
    assert torch.isnan(losses[1]) and torch.isfinite(losses[[0, 2]]).all()
    with pytest.raises(RuntimeError, match="label 40 out of range"):
        kernels.softmax_cross_entropy_rows(
            torch.randn(3, 40), bias, torch.tensor([0, 40, 2]), valid, losses, hits, None, 0, 3
        )


def test_unbuildable_kernels_mean_no_cpu_backend(monkeypatch):
    monkeypatch.setattr(native, "kernels", lambda: None)
    embedding, decoder, features, labels = _logits_case()
    assert accel.apply(decoder, torch.device("cpu")) == "off" and not hasattr(decoder, "cross_entropies")
    x = torch.randn(4, 8)
    torch.manual_seed(0)
    dropped = dropout.fast_dropout(x, 0.3)  # torch's own dropout then
    torch.manual_seed(0)
    assert torch.equal(dropped, torch.nn.functional.dropout(x, 0.3))


def _waiting_for_the_lock(directory):
    """A started thread that takes the build lock of ``directory`` (polling fast), and the event it sets then."""
    import threading

    acquired = threading.Event()

    def wait_for_lock():
        with native.build_lock(directory, poll_s=0.05):
            acquired.set()

    waiter = threading.Thread(target=wait_for_lock)
    waiter.start()
    return waiter, acquired


@pytest.mark.slow
def test_a_live_build_s_lock_is_waited_for_saying_whose_and_never_taken(tmp_path, capsys):
    import os
    import subprocess
    import sys
    import time

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from spanlm.accel import native\n"
            "with native.build_lock(Path(sys.argv[1])):\n    print('held', flush=True); sys.stdin.read()",
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        lock = tmp_path / native.LOCK_NAME
        old = time.time() - 3600  # an hour-long build on a loaded machine is still a live one
        os.utime(lock, (old, old))
        waiter, acquired = _waiting_for_the_lock(tmp_path)
        time.sleep(1.0)
        assert not acquired.is_set() and lock.exists()
        holder.stdin.close()  # the build ends; its lock is released
        waiter.join(timeout=30)
        assert acquired.is_set()
    finally:
        holder.kill()
        holder.wait()
    err = capsys.readouterr().err
    assert err.count("waiting for process") == 1 and f"waiting for process {holder.pid} to finish building" in err
    assert not lock.exists()


def test_the_lock_of_a_build_killed_outright_is_taken_over(tmp_path, capsys):
    import socket
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid names no process now
    lock = tmp_path / native.LOCK_NAME
    for owner in (
        f"{dead.pid} {socket.gethostname()} {native._boot_id()}",
        f"{os.getpid()} {socket.gethostname()} an-earlier-boot",
    ):
        lock.write_text(owner + "\n")
        (tmp_path / "lock").touch()  # PyTorch's own lock, left by the killed build
        with native.build_lock(tmp_path):
            assert lock.read_text().split()[0] == str(os.getpid()) and not (tmp_path / "lock").exists()
        assert not lock.exists()
        assert "removed the build lock" in capsys.readouterr().err
    with native.build_lock(None):  # no known build directory: nothing to lock
        pass


def test_a_lock_of_another_host_is_waited_for_naming_the_host(tmp_path, capsys):
    lock = tmp_path / native.LOCK_NAME
    lock.write_text("4242 another-host boot\n")
    waiter, acquired = _waiting_for_the_lock(tmp_path)
    try:
        import time

        time.sleep(0.5)
        assert not acquired.is_set()
    finally:
        lock.unlink()
        waiter.join(timeout=30)
    assert acquired.is_set() and "waiting for process 4242 on another-host" in capsys.readouterr().err


def test_tensors_off_the_cpu_never_build_or_load_the_kernels(monkeypatch):
    def no_build():
        raise AssertionError("the CPU kernels were asked for by tensors on another device")

    monkeypatch.setattr(native, "kernels", no_build)
    from spanlm.train.optim import clip_gradients, total_norm

    parameters = [torch.nn.Parameter(torch.zeros(n, 8, device="meta")) for n in (4, 1 << 17)]
    for parameter in parameters:
        parameter.grad = torch.ones_like(parameter)
    assert total_norm([p.grad for p in parameters]).device.type == "meta"
    optimizer = torch.optim.AdamW(parameters, lr=1e-3)
    assert clip_gradients(optimizer, parameters, 1.0).device.type == "meta"
    x = torch.ones(4, 8, device="meta")
    assert dropout.fast_dropout(x, 0.1).device.type == "meta"
    assert accel.apply(torch.nn.Linear(2, 2), torch.device("meta")) == "off"
    assert accel.gradient_norm(accel.backend(torch.device("meta")), total_norm) is total_norm


def test_the_build_is_keyed_by_source_flags_and_torch_not_by_checkout_or_file_time(tmp_path, monkeypatch):
    flags = ["-O3", "-fopenmp", "-mavx2", "-mfma"]
    source = native.SOURCE.read_bytes()
    for checkout in ("a", "b"):
        (tmp_path / checkout).mkdir()
        (tmp_path / checkout / "kernels.cpp").write_bytes(source)
        os.utime(tmp_path / checkout / "kernels.cpp", (1e9 if checkout == "a" else 2e9,) * 2)
    names = {native.build_name((tmp_path / c / "kernels.cpp").read_bytes(), "AVX2", flags) for c in ("a", "b")}
    assert len(names) == 1 and next(iter(names)).startswith("spanlm_native_avx2_")
    assert native.build_name(source + b"\n// changed", "AVX2", flags) not in names
    assert native.build_name(source, "AVX2", flags[:-1]) not in names
    assert native.build_name(source, "AVX512", flags) not in names
    assert native.build_name(source, "AVX2", flags, "2.13.0 /other/venv/torch") not in names  # another PyTorch
    # Another ninja on PATH (its log of commands is foreign to another version): another build.
    for directory in ("ninja-a", "ninja-b"):
        (tmp_path / directory).mkdir()
        (tmp_path / directory / "ninja").write_text("#!/bin/sh\n")
        (tmp_path / directory / "ninja").chmod(0o755)
    toolchains = set()
    for directory in ("ninja-a", "ninja-b"):
        monkeypatch.setenv("PATH", str(tmp_path / directory))
        assert native.ninja_binary() == str(tmp_path / directory / "ninja")
        toolchains.add(native.toolchain())
    assert len(toolchains) == 2
    # Both checkouts compile the same file, in the build directory: the commands PyTorch writes are identical.
    build = tmp_path / "build"
    build.mkdir()
    copy = native._source_copy(build)
    assert copy.parent == build and copy.read_bytes() == source
    monkeypatch.setattr(native, "SOURCE", tmp_path / "b" / "kernels.cpp")
    assert native._source_copy(build) == copy and not native._built(build, "spanlm_native_x")
