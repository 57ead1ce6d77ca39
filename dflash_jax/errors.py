"""Every error a user can cause, under one base class that ``dflash-jax`` prints as one line.

``cli.main`` catches ``DFlashError`` and exits with ``error: <message>``; the message names the
problem and the fix. The classes subclass ``ValueError`` so that code written against plain
``ValueError`` keeps working.
"""

from __future__ import annotations


class DFlashError(ValueError):
    """Bad input: a file, folder, config or argument that is not what it must be."""


class ConfigError(DFlashError):
    """A model or training config asks for something this implementation does not do."""


class CheckpointError(DFlashError):
    """A checkpoint or source folder is missing, corrupt, or not what it claims to be."""


class DataError(CheckpointError):
    """A data folder or prompt file that is not what it claims (names the file and the fix)."""


class BenchError(DFlashError):
    """Bad benchmark input (missing prompt files, malformed rows, a resume with other settings)."""
