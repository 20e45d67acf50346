"""User-facing errors: the CLI prints them as one line and exits with code 2, never a traceback."""


class SpanlmError(Exception):
    """An error caused by the user's input (files, config, data) rather than a bug in spanlm."""


class ConfigError(SpanlmError):
    """A recipe or override that does not match the typed config."""


class InputError(SpanlmError):
    """Bad input data; the message names the file and, where it applies, the line."""
