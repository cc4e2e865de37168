"""Errors that name the setting they are about, so each front end can name it its own way.

A library setting (a :class:`qkv.inference.Decoding` field, a ``TrainConfig`` key) that is out
of range raises :class:`SettingError`: a ``ValueError`` whose message starts with the setting's
name, and whose :attr:`~SettingError.key` says which setting it is. The command line turns the
key into the flag the user typed (``beam_size`` -> ``--beam``) from the attribute, never by
parsing the message. A setting whose error is of another kind (the file it names does not
exist, the checkpoint it names is damaged, the run folder it names is in use) raises that kind,
made by :func:`keyed` so that it carries the same ``key`` and ``problem``; :func:`setting_of`
reads them from either, :func:`renamed` names the setting otherwise. This module imports
nothing of qkv (floor 0).

>>> err = SettingError("beam_size", "expected an int >= 1, got 0")
>>> str(err), err.key
('beam_size: expected an int >= 1, got 0', 'beam_size')
>>> str(err.renamed("--beam"))
'--beam: expected an int >= 1, got 0'
>>> gone = keyed(FileNotFoundError, "data", "no such file 'x.tsv'")
>>> setting_of(gone), str(renamed(gone, "--data")), type(renamed(gone, "--data")).__name__
(('data', "no such file 'x.tsv'"), "--data: no such file 'x.tsv'", 'FileNotFoundError')
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["SettingError", "keyed", "renamed", "setting_of"]

E = TypeVar("E", bound=BaseException)

#: the attribute that marks an error of another kind made by :func:`keyed`
_MARK = "_qkv_setting"


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
        return renamed(self, name)

    def __reduce__(self) -> tuple:
        # pickled as its message and attributes (a worker process's error reaches its parent)
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(kind: type[E], args: tuple, state: dict) -> E:
    """An error of type ``kind`` with ``args`` and attributes ``state``, its constructor not
    called (a :class:`SettingError` takes a key and a problem, not its message)."""
    err = kind.__new__(kind)
    err.args = args
    err.__dict__.update(state)
    return err


def keyed(kind: type[E], key: str, problem: str) -> E:
    """An error of type ``kind`` (constructed from its message alone) about setting ``key``:
    ``"{key}: {problem}"``, with the ``key`` and ``problem`` attributes a :class:`SettingError`
    has. For a setting whose error is not a ``ValueError``: ``keyed(FileNotFoundError, "data",
    ...)``, ``keyed(CheckpointError, "resume_from", ...)`` (a ``SettingError`` kind: that one)."""
    if issubclass(kind, SettingError):
        return kind(key, problem)
    err = kind(f"{key}: {problem}")
    err.key, err.problem = key, problem  # type: ignore[attr-defined]
    setattr(err, _MARK, True)
    return err


def setting_of(err: BaseException) -> tuple[str, str] | None:
    """``(key, problem)`` of a :class:`SettingError` or an error made by :func:`keyed`; None
    for any other error, whatever its message says."""
    if isinstance(err, SettingError) or getattr(err, _MARK, False):
        return err.key, err.problem  # type: ignore[attr-defined]
    return None


def renamed(err: E, name: str) -> E:
    """A copy of ``err`` (a :class:`SettingError` or an error made by :func:`keyed`: the same
    type, its attributes) whose message names the setting ``name`` (a flag, a request field);
    its ``key`` stays the library's."""
    setting = setting_of(err)
    if setting is None:
        raise TypeError(f"err: expected an error about a setting, got {type(err).__name__}")
    return _rebuilt(type(err), (f"{name}: {setting[1]}",), dict(err.__dict__))
