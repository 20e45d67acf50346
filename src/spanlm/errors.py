"""User-facing errors: the CLI prints them as one line and exits with code 2, never a traceback."""

from __future__ import annotations

import os
from collections.abc import Iterator

UTF8_BOM = b"\xef\xbb\xbf"  # dropped where a file starts with it, as the "utf-8-sig" codec does


class SpanlmError(Exception):
    """An error caused by the user's input (files, config, data) rather than a bug in spanlm."""


class ConfigError(SpanlmError):
    """A recipe or override that does not match the typed config."""


class InputError(SpanlmError):
    """Bad input data; the message names the file and, where it applies, the line."""


def require_file(path, setting: str | None = None) -> None:
    """An :class:`InputError` unless ``path`` is a regular file (or a link to one): a directory, a named pipe, a
    socket or a device is named as what it is, not as a missing file. ``setting``: the option or key that
    gave the path, said in the error."""
    import stat
    from pathlib import Path

    path = Path(path)
    given = f" ({setting})" if setting else ""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise InputError(f"{path}: no such file{given}") from None
    except OSError as error:  # a path through a file, a loop of links, no permission
        raise InputError(f"{path}: cannot be read{given} ({error.strerror or error})") from None
    if stat.S_ISDIR(mode):
        raise InputError(f"{path}: is a directory, not a file{given}")
    if not stat.S_ISREG(mode):
        # spanlm reads an input more than once (its fingerprint, then its text): a stream cannot be read again.
        raise InputError(f"{path}: is {_special_kind(mode)}, not a regular file{given}; save its content to a file")


def require_directory(path, setting: str | None = None) -> None:
    """An :class:`InputError` unless ``path`` is a directory (or a link to one): a file is named as a file, not as a
    missing directory. ``setting``: the option or key that gave the path, said in the error."""
    import stat
    from pathlib import Path

    path = Path(path)
    given = f" ({setting})" if setting else ""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise InputError(f"{path}: no such directory{given}") from None
    except OSError as error:
        raise InputError(f"{path}: cannot be read{given} ({error.strerror or error})") from None
    if stat.S_ISREG(mode):
        raise InputError(f"{path}: is a file, not a directory{given}")
    if not stat.S_ISDIR(mode):
        raise InputError(f"{path}: is {_special_kind(mode)}, not a directory{given}")


def _special_kind(mode: int) -> str:
    import stat

    kinds = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"))
    return next((name for test, name in kinds if test(mode)), "a block device" if stat.S_ISBLK(mode) else "no file")


def read_text(path) -> str:
    """The text of a user's UTF-8 file (a leading BOM dropped), or an :class:`InputError` naming the file."""
    from pathlib import Path

    path = Path(path)
    require_file(path)
    raw = path.read_bytes()
    bom = len(UTF8_BOM) if raw.startswith(UTF8_BOM) else 0
    try:
        return raw[bom:].decode("utf-8")
    except UnicodeDecodeError as error:
        start = bom + error.start  # in the file
        line = raw.count(b"\n", 0, start) + 1
        raise InputError(f"{path}:{line}: not UTF-8 text ({error.reason} at byte {start})") from None


def numbered_lines(source) -> Iterator[tuple[int, str | UnicodeDecodeError]]:
    """(line number from 1, the line decoded as UTF-8 without its line break) for every line of ``source``,
    a path or a binary file already open (a .gz stream).

    Lines end at "\n" only (a U+2028 or form feed inside a line is text, unlike ``str.splitlines``); a
    leading BOM is dropped; a line that is not UTF-8 comes as its ``UnicodeDecodeError``, for the caller
    to report with the line number (:func:`undecodable`) or to skip.
    """
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as handle:
            yield from numbered_lines(handle)
        return
    for number, raw in enumerate(source, 1):
        bom = len(UTF8_BOM) if number == 1 and raw.startswith(UTF8_BOM) else 0
        try:
            yield number, raw[bom:].decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as error:  # positions in the line as it is in the file
            yield number, UnicodeDecodeError("utf-8", raw, error.start + bom, error.end + bom, error.reason)


def undecodable(error: UnicodeDecodeError) -> str:
    """What is wrong with a line :func:`numbered_lines` could not decode (for a message naming file and line)."""
    return f"invalid UTF-8 at byte {error.start} of the line"
