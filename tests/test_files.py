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
