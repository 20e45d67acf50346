"""Writing files and directories so that a crash or a full disk never leaves them half-written, and reading
back the metadata files spanlm keeps beside its data so that damage is never taken for absence.

Every durable write of spanlm goes through here: a file is written beside its final name and renamed
over it; a directory is filled under a temporary sibling, fsynced and swapped into place. Running out of
space becomes a one-line :class:`~spanlm.errors.InputError` that says what was kept.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from spanlm.errors import InputError
from spanlm.processes import process_alive


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


# A write the device refused: a full disk, a quota, a file-size limit, or the device failing (EIO).
OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)
# How libraries that wrap the OSError say it: safetensors "(os error 28)", numpy's short write, torch.save's zip
# writer, which checks its position after each write and loses the errno of a short one ("unexpected pos N vs M").
_OUT_OF_SPACE_TEXT = re.compile(
    r"No space left on device|Disk quota exceeded|File too large|Input/output error|\d+ requested and \d+ written"
    r"|unexpected pos \d+ vs \d+|PytorchStreamWriter failed writing"
)
_SHORT_WRITE = "the device took fewer bytes than were written: a full disk or a failing device"


def out_of_space(error: BaseException) -> str | None:
    """Why, when ``error`` or what led to it is the file system refusing more bytes (a full disk, a quota,
    a file-size limit, an I/O error); else None. The chain is searched because libraries wrap the OSError (torch.save
    raises a RuntimeError in whose context it is; safetensors and numpy raise their own types)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in OUT_OF_SPACE:
            return os.strerror(seen.errno)
        if (match := _OUT_OF_SPACE_TEXT.search(str(seen))) is not None:
            found = match.group(0)
            return _SHORT_WRITE if found.startswith(("unexpected pos", "PytorchStreamWriter")) else found
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


def require_file_to_write(path: Path) -> None:
    """An :class:`InputError` naming ``path``, the output a user gave, when it is a directory: not an error about
    the temporary file beside it that the write goes through."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a directory; give the path of a file to write")
    if not path.parent.is_dir():
        raise InputError(
            f"{path}: its folder {path.parent} does not exist" + (" (a file)" if path.parent.exists() else "")
        )


def write_text_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole, or what it held before (a full disk leaves it as it was)."""
    require_file_to_write(path)
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


def temporary_sibling(out: Path) -> Path:
    """A new temporary directory beside ``out`` (``.NAME.tmp-PID-…``), after removing those that processes no longer
    running left there: a writer killed (SIGTERM's default, SIGKILL, a node lost) never ran its clean-up."""
    out.parent.mkdir(parents=True, exist_ok=True)
    left = re.compile(rf"^\.{re.escape(out.name)}\.tmp-(\d+)-")
    for sibling in out.parent.iterdir():
        if (match := left.match(sibling.name)) and sibling.is_dir() and not process_alive(int(match.group(1))):
            shutil.rmtree(sibling, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))


def write_directory(out: Path, fill: Callable[[Path], None]) -> Path:
    """Write ``out`` through ``fill(tmp)`` into a temporary sibling, fsync it and swap it into place.

    A crash or error midway leaves the previous ``out`` (if any) as it was and no partial directory; a
    full disk is a one-line InputError saying so.
    """
    kept = f"the previous {out} is intact" if out.exists() else "nothing was written"
    tmp = temporary_sibling(out)
    try:
        with full_disk_is_an_input_error(out, kept):
            fill(tmp)
            replace_directory(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_metadata(path: str | Path, remedy: str, expect: type = dict) -> Any:
    """The content of a metadata file (meta.json, manifest.json, trackers.json, config.yaml, a tokenizer's
    JSON files, runs.txt), parsed by its suffix (.json: JSON, .yaml / .yml: YAML, else the text), or None when
    there is no such file.

    A file that is there but cannot be read, is not UTF-8, does not parse or is not the ``expect``-ed kind
    (a JSON object for most) is a one-line :class:`InputError` naming it and saying what to do
    (``remedy``). Why never None: a caller reads "absent" as "build it afresh", and a prepared corpus
    rebuilt for a damaged meta.json gets a new tokenizer.
    """
    path = Path(path)
    if not os.path.lexists(path):
        return None
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a file; {remedy}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: damaged (not UTF-8 text at byte {error.start}); {remedy}") from None
    except OSError as error:
        raise InputError(f"{path}: cannot be read ({error.strerror or error}); {remedy}") from None
    if path.suffix == ".json":
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            where = f"line {error.lineno} column {error.colno}"
            raise InputError(f"{path}: damaged (not valid JSON: {error.msg} at {where}); {remedy}") from None
    elif path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(error, "problem", None) or "unparsable"
            raise InputError(f"{path}: damaged (not valid YAML: {problem}{where}); {remedy}") from None
    else:
        value = text
    if not isinstance(value, expect):
        wanted = {dict: "a mapping", list: "a list", str: "text"}.get(expect, expect.__name__)
        raise InputError(f"{path}: damaged ({wanted} expected, found {type(value).__name__}); {remedy}")
    return value


TOKENIZER_DAMAGED = (
    "restore the tokenizer files from where they were saved (a pretraining run keeps a copy in tokenizers/)"
)


def check_tokenizer_files(directory: Path) -> None:
    """The JSON files of a tokenizer directory, each whole and of its kind, with an error naming the damaged one.

    Why: transformers reports a tokenizer.json that is JSON but not a tokenizer's by the first key it misses
    (``'added_tokens'``), and a damaged tokenizer_config.json by a JSON position, naming neither file.
    """
    for name in ("tokenizer_config.json", "special_tokens_map.json", "config.json"):
        read_metadata(directory / name, TOKENIZER_DAMAGED)
    serialized = read_metadata(directory / "tokenizer.json", TOKENIZER_DAMAGED)
    if serialized is not None:
        missing = [key for key in ("model", "added_tokens") if key not in serialized]
        if missing or not isinstance(serialized["model"], dict):
            raise InputError(
                f"{directory / 'tokenizer.json'}: JSON but not a tokenizer (no {' or '.join(missing) or 'model'} "
                f"section, which the `tokenizers` library writes); {TOKENIZER_DAMAGED}"
            )


def refuse_to_overwrite_inputs(
    output: str | Path, inputs, option: str, replaces_directory: bool = False, enters: bool = False
) -> None:
    """An :class:`InputError` when writing ``output`` (given as ``option``) would overwrite one of ``inputs``.

    Overwriting is: the same file (a symbolic or hard link included); with ``replaces_directory`` (the output
    is a directory swapped in whole), an input inside it; with ``enters``, the output inside an input
    directory (a checkpoint, whose files a manifest vouches for). Why: a command reads its inputs before it
    writes, so it would succeed — and the only copy of the input would be gone.
    """
    out = Path(output).resolve()
    for given in inputs:
        if given is None:
            continue
        source = Path(given).resolve()
        same = out == source or (out.exists() and source.exists() and os.path.samefile(out, source))
        if same or (replaces_directory and source.is_relative_to(out)) or (enters and out.is_relative_to(source)):
            what = "is" if same else ("holds" if replaces_directory and source.is_relative_to(out) else "is inside")
            raise InputError(
                f"{output}: {option} {what} the input {given}; write it elsewhere (the input is untouched)"
            )


def guard_outputs(outputs: Mapping[str, str | Path | None], inputs: Mapping[str, object]) -> None:
    """Refuse, before anything is written, an output that is one of the command's inputs, lies inside one, or holds
    one: one :class:`InputError` naming the output option, the input and its setting.

    ``outputs``: option or key (``train.output_dir``, ``--out``) → path (None: not given); ``inputs``: what the
    command reads (``model.path``, ``data.train``, ``recipe``…) → a path, a list of paths or None. Dataset names
    (``hf:…``) are not paths. A link to an input counts as the input. Why: a command reads its inputs before it
    writes, so it would succeed — writing checkpoints into the encoder it fine-tunes, replacing the recipe it read —
    and the only copy of the input would be changed or gone. Every command calls this (tests/test_output_guard.py
    enumerates them).
    """
    written = [(option, output) for option, output in outputs.items() if output]
    for index, (option, output) in enumerate(written):  # two outputs of one command: one would clobber the other
        for other_option, other in written[index + 1 :]:
            if relation := _relation(output, other):
                raise InputError(f"{output}: {option} {relation} {other_option} {other}; give each output its own path")
    given = [(name, path) for name, value in inputs.items() for path in _paths(value)]
    for option, output in written:
        for name, source_path in given:
            if relation := _relation(output, source_path):
                raise InputError(
                    f"{output}: {option} {relation} the input {source_path} ({name}); write it elsewhere (the input "
                    "is untouched)"
                )


def _relation(path: str | Path, other: str | Path) -> str | None:
    """How ``path`` stands to ``other``: "is" it (a link to it too), "is inside" it, "holds" it, or None."""
    first, second = Path(path).resolve(), Path(other).resolve()
    if first == second or (first.exists() and second.exists() and os.path.samefile(first, second)):
        return "is"
    if first.is_relative_to(second):
        return "is inside"
    if second.is_relative_to(first):
        return "holds"
    return None


def _paths(value) -> list[str | Path]:
    """The file-system paths of an input setting: one path, a list of them, neither None, empty nor a dataset name."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in values if v and not str(v).startswith(("hf:", "hf://"))]


def files_of(directory: str | Path) -> list[Path]:
    """The files directly in ``directory`` (none when it is not one): a model directory's files, which an output
    must not overwrite, though an output may go beside them."""
    directory = Path(directory)
    return [path for path in directory.iterdir() if path.is_file()] if directory.is_dir() else []


def refused_pickle(error: Exception) -> str:
    """Why ``torch.load(..., weights_only=True)`` did not load a file, without torch's advice that loading it with
    ``weights_only=False`` "will likely succeed": wrong for a corrupt file, and for a tampered one the way to run
    its code. Nothing of the file ran: weights-only loading refuses before it builds anything."""
    import pickle

    if isinstance(error, pickle.UnpicklingError):
        found = re.search(r"GLOBAL ([\w.]+)", str(error))
        held = found.group(1) if found else "objects"
        return f"it holds {held}, beyond tensors and plain data; refused without running anything"
    return str(error).split("\n")[0].split(". ")[0]  # the cause, without torch's advice


def check_safetensors(path: Path) -> None:
    """``path`` is a whole safetensors file whose floating-point tensors are all finite."""
    import torch
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                    raise InputError(f"{path}: tensor {name} holds non-finite values (NaN or infinity)")
    except SafetensorError as error:
        raise InputError(f"{path}: not a whole safetensors file (truncated or corrupt: {error})") from None
