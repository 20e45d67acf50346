"""Directory replacement of spanlm.files: atomic, and with the modes a plain mkdir would give."""

import os
import stat
import tempfile
from pathlib import Path

from spanlm.files import replace_directory


def test_replaced_directories_get_the_usual_modes_and_keep_a_shared_group(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o2775)  # a group-shared directory: what is created inside inherits its group
    tmp = Path(tempfile.mkdtemp(dir=shared))  # 0700, as prepare and export make them
    (tmp / "sub").mkdir()
    (tmp / "sub" / "file").write_text("x")
    os.chmod(tmp / "sub" / "file", 0o600)
    replace_directory(tmp, shared / "out")
    umask = os.umask(0)
    os.umask(umask)
    out = (shared / "out").stat().st_mode
    assert out & 0o777 == 0o777 & ~umask and out & stat.S_ISGID
    assert (shared / "out" / "sub" / "file").stat().st_mode & 0o777 == 0o666 & ~umask
    assert not tmp.exists()


class _Tampered:
    """What a tampered weights file could hold: unpickling it would create ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_refused_pickle_is_explained_without_torchs_unsafe_hint(tmp_path):
    import pytest
    import torch

    from spanlm.files import refused_pickle

    marker = tmp_path / "code-ran"
    torch.save({"weight": torch.zeros(2), "payload": _Tampered(marker)}, tmp_path / "tampered.pt")
    (tmp_path / "corrupt.pt").write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    for name in ("tampered.pt", "corrupt.pt"):
        with pytest.raises(Exception) as error:
            torch.load(tmp_path / name, weights_only=True)
        reason = refused_pickle(error.value)
        assert "weights_only" not in reason and "succeed" not in reason and reason, reason
    assert "open" in refused_pickle(_load_error(tmp_path / "tampered.pt")) and not marker.exists()


def _load_error(path):
    import torch

    try:
        torch.load(path, weights_only=True)
    except Exception as error:  # noqa: BLE001
        return error
    raise AssertionError(f"{path} loaded")


def test_metadata_damage_is_named_and_never_read_as_absent(tmp_path):
    import pytest

    from spanlm.errors import InputError
    from spanlm.files import read_metadata

    assert read_metadata(tmp_path / "none.json", "fix it") is None
    cases = {
        "cut.json": (b'{"a": ', "not valid JSON: Expecting value at line 1 column 7"),
        "latin1.json": (b'{"a": "\xe9"}', "not UTF-8 text at byte 7"),
        "list.json": (b"[1]", "a mapping expected, found list"),
        "tabs.yaml": (b"a:\n\t- b\n", "not valid YAML"),
        "runs.txt": (b"\xff", "not UTF-8"),
    }
    for name, (content, reason) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(InputError) as error:
            read_metadata(tmp_path / name, "fix it", str if name.endswith(".txt") else dict)
        assert str(error.value).startswith(f"{tmp_path / name}: ") and reason in str(error.value)
        assert str(error.value).endswith("; fix it")
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(InputError, match="is a directory"):
        read_metadata(tmp_path / "dir.json", "fix it")
    (tmp_path / "ok.yaml").write_text("a: 1\n", encoding="utf-8")
    assert read_metadata(tmp_path / "ok.yaml", "fix it") == {"a": 1}


def test_a_new_write_removes_what_a_killed_writer_left_and_nothing_of_a_live_one(tmp_path):
    """A writer killed mid-way (SIGTERM's default, SIGKILL) leaves its temporary directory; the next write beside it
    removes it, and leaves alone one whose process still runs (another writer at work)."""
    import os
    import subprocess
    import sys

    from spanlm.files import write_directory

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / f".corpus.tmp-{int(dead.stdout)}-abc123"
    running = tmp_path / f".corpus.tmp-{os.getpid()}-def456"
    other = tmp_path / f".corpus-2.tmp-{int(dead.stdout)}-ghi789"  # another output's: not this write's to judge
    for directory in (left, running, other):
        directory.mkdir()
        (directory / "ids.npy").write_bytes(b"partial")
    write_directory(tmp_path / "corpus", lambda tmp: (tmp / "meta.json").write_text("{}"))
    assert not left.exists() and running.is_dir() and other.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([running.name, other.name, "corpus"])
