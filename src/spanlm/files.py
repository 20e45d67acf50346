"""Writing files and directories so that a crash or a full disk never leaves them half-written.

Every durable write of spanlm goes through here: a file is written beside its final name and renamed
over it; a directory is filled under a temporary sibling, fsynced and swapped into place. Running out of
space becomes a one-line :class:`~spanlm.errors.InputError` that says what was kept.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from spanlm.errors import InputError


def fsync_tree(directory: Path) -> None:
    for root, _, files in os.walk(directory):
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                os.fsync(handle.fileno())
    fsync_directory(directory)


def fsync_directory(directory: Path) -> None:
    """Make the directory's entries (a rename into it, a new file) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_directory(tmp: Path, final: Path) -> None:
    """Atomically put ``tmp`` in place of ``final`` (an old ``final`` is removed only afterwards)."""
    _usual_modes(tmp)
    fsync_tree(tmp)
    old = None
    if final.exists():
        old = final.with_name(f"{final.name}.old-{os.getpid()}")
        final.rename(old)
    tmp.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# How libraries that wrap the OSError say it: safetensors "(os error 28)", numpy's short write.
_OUT_OF_SPACE_TEXT = re.compile(
    r"No space left on device|Disk quota exceeded|File too large|\d+ requested and \d+ written"
)


def out_of_space(error: BaseException) -> str | None:
    """Why, when ``error`` or what led to it is the file system refusing more bytes (a full disk, a quota,
    a file-size limit); else None. The chain is searched because libraries wrap the OSError (torch.save
    raises a RuntimeError in whose context it is; safetensors and numpy raise their own types)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in OUT_OF_SPACE:
            return os.strerror(seen.errno)
        if (match := _OUT_OF_SPACE_TEXT.search(str(seen))) is not None:
            return match.group(0)
        seen = seen.__cause__ or seen.__context__
    return None


@contextlib.contextmanager
def full_disk_is_an_input_error(target: Path, kept: str):
    """Turn running out of space while writing ``target`` into a one-line InputError saying what is ``kept``."""
    try:
        yield
    except Exception as error:
        reason = out_of_space(error)
        if reason is None:
            raise
        raise InputError(f"{target}: could not be written ({reason}); {kept}") from None


def write_text_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole, or what it held before (a full disk leaves it as it was)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    kept = f"the previous {path} is intact" if path.exists() else "nothing was written"
    try:
        with full_disk_is_an_input_error(path, kept):
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _usual_modes(root: Path) -> None:
    """The modes a plain mkdir / open would have given (0755 / 0644 under the usual umask): a temporary
    directory from ``mkdtemp`` is 0700, and a prepared corpus or an export is meant to be shared."""
    umask = os.umask(0)
    os.umask(umask)
    for directory, _, files in os.walk(root):
        inherited = os.stat(directory).st_mode & stat.S_ISGID  # a group-shared parent's setgid, as mkdir keeps it
        os.chmod(directory, (0o777 & ~umask) | inherited)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o666 & ~umask)


def write_directory(out: Path, fill: Callable[[Path], None]) -> Path:
    """Write ``out`` through ``fill(tmp)`` into a temporary sibling, fsync it and swap it into place.

    A crash or error midway leaves the previous ``out`` (if any) as it was and no partial directory; a
    full disk is a one-line InputError saying so.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = f"the previous {out} is intact" if out.exists() else "nothing was written"
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        with full_disk_is_an_input_error(out, kept):
            fill(tmp)
            replace_directory(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
