"""The two ways a model reference fails: bad input in the job, or a bug in the model's code."""

from __future__ import annotations

import os
import traceback
from collections.abc import Sequence

from launch.errors import BadInput


class ModelRefError(BadInput):
    """The model the job names cannot be used: not found, not callable, wrong parameters,
    input that disagrees with the data. `param` is the model key to blame ("name",
    "path", or a parameter), as load_job reports it (model.<param>)."""

    def __init__(self, message: str, param: str = "name"):
        super().__init__(message)
        self.param = param


class ModelCodeError(BadInput):
    """The user's own model code raised. The message names the model and where it
    was (importing it, building tower i); `details` is the traceback of the user's
    frames only, which the command prints above the error line."""

    def __init__(self, message: str, details: str):
        super().__init__(message)
        self.details = details


def code_error(error: BaseException, reference: str, during: str,
               roots: Sequence[str], ours: Sequence[str], hint: str = "") -> ModelCodeError:
    """A ModelCodeError for `error`, raised by model `reference` while `during`; `hint`
    is appended to its one line.

    roots: directories holding the user's code; frames outside them (TensorFlow,
    Keras, towers itself) are left out of the traceback, or, when none is inside
    (the user's code raised from TensorFlow's), the last frame is kept.
    ours: this project's package directories, never the user's even when below a root.
    """
    frames = traceback.extract_tb(error.__traceback__)
    mine = [f for f in frames if _is_file(f.filename) and _under(f.filename, roots)
            and not _under(f.filename, ours)]
    # A module that does not compile raised from the import machinery alone: its
    # location is in the error itself, and no frame of Python's is the user's.
    fallback = [] if isinstance(error, SyntaxError) else frames[-1:]
    shown = traceback.format_list(mine or fallback)
    what = "".join(traceback.format_exception_only(type(error), error)).strip()
    details = "Traceback (the model's own code, most recent call last):\n" + "".join(shown)
    details += what + "\n"
    return ModelCodeError(f"model.name: {reference} failed {during}: {_summary(error, what)}"
                          f"{hint}", details)


def _summary(error: BaseException, what: str) -> str:
    """The error in one line: its type and message (the last line Python prints for it),
    with the file and line of a SyntaxError, whose message says neither."""
    summary = what.splitlines()[-1] if what else type(error).__name__
    if isinstance(error, SyntaxError) and error.filename:
        summary += f" ({error.filename}, line {error.lineno})"
    return summary


def _is_file(filename: str) -> bool:
    """Not one of Python's own frozen modules (`<frozen importlib._bootstrap>`)."""
    return not filename.startswith("<")


def _under(filename: str, directories: Sequence[str]) -> bool:
    path = os.path.abspath(filename)
    return any(path == d or path.startswith(d.rstrip(os.sep) + os.sep) for d in directories)
