"""Errors that name the setting they are about, so each front end can name it its own way.

A library setting (a :class:`qkv.inference.Decoding` field, a ``TrainConfig`` key) that is out
of range raises :class:`SettingError`: a ``ValueError`` whose message starts with the setting's
name, and whose :attr:`~SettingError.key` says which setting it is. The command line turns the
key into the flag the user typed (``beam_size`` -> ``--beam``) from the attribute, never by
parsing the message. This module imports nothing of qkv (floor 0).

>>> err = SettingError("beam_size", "expected an int >= 1, got 0")
>>> str(err), err.key
('beam_size: expected an int >= 1, got 0', 'beam_size')
>>> str(err.renamed("--beam"))
'--beam: expected an int >= 1, got 0'
"""

from __future__ import annotations

__all__ = ["SettingError"]


class SettingError(ValueError):
    """A setting out of range: ``"{key}: {problem}"``.

    Attributes:
        key: the setting's name as the library spells it (``"beam_size"``).
        problem: what was expected and what came (``"expected an int >= 1, got 0"``).
    """

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key, self.problem = key, problem

    def renamed(self, name: str) -> SettingError:
        """The same error, naming the setting ``name`` (a flag, a request field); ``key`` kept."""
        err = SettingError(name, self.problem)
        err.key = self.key
        return err
