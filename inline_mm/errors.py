"""Errors that come from what the user gave (a config, a file, a data folder).

Every check of the plugin that can blame the user's input raises one of these.
They subclass the built-in exception a caller would expect (``ValueError``,
``FileNotFoundError``, ``RuntimeError``), so ``except ValueError`` keeps
working, and they share the marker :class:`UserInputError`, which the
command-line tools turn into one clear line and a non-zero exit instead of a
traceback (see :func:`inline_mm.engine.launch.cli_main`).  Anything else is a
bug and keeps its traceback.

Each class takes a single message argument: mmengine's registry re-raises
errors from a constructor as ``type(err)(message)``, which keeps the class.
"""


class UserInputError(Exception):
    """Marker base: the problem is in the user's input and the message says how to fix it."""


class ConfigError(UserInputError, ValueError):
    """A config entry or a constructor argument is invalid (wrong arch, attn_type ...)."""


class DataError(UserInputError, ValueError):
    """A dataset does not fit the config (classes, labels, an empty dataset)."""


class MissingFileError(UserInputError, FileNotFoundError):
    """A file or folder the user named does not exist."""


class CheckpointError(UserInputError, RuntimeError):
    """A checkpoint cannot be read safely or does not fit the model."""


class CheckpointMismatchError(CheckpointError):
    """A readable checkpoint is of another model: another arch, family or task."""


class ToolkitVersionError(UserInputError, ImportError):
    """The installed mmengine / mmcv / mmdet / mmseg do not form a stack the plugin runs on.

    Raised by ``import inline_mm`` (see :mod:`inline_mm.stack`) before any toolkit is
    imported; the message names the versions found, the ranges expected and the pip
    command that fixes the environment.
    """
