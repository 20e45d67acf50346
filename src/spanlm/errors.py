"""User-facing errors: the CLI prints them as one line and exits with code 2, never a traceback."""


class SpanlmError(Exception):
    """An error caused by the user's input (files, config, data) rather than a bug in spanlm."""


class ConfigError(SpanlmError):
    """A recipe or override that does not match the typed config."""


class InputError(SpanlmError):
    """Bad input data; the message names the file and, where it applies, the line."""


def read_text(path) -> str:
    """The text of a user's UTF-8 file (a leading BOM dropped), or an :class:`InputError` naming the file."""
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
