"""How to decode: one frozen value for every decoding option, checked once.

:class:`Decoding` travels from the model folder (``decoding.json``) through the translator, the
command line, the server and training's validation down to the search
(:func:`qkv.decoding.search_hypotheses` takes it as it is); nothing else carries a beam size or a length
penalty on its own. It lives beside the search that reads it and is re-exported as
``qkv.inference.Decoding``. A translator holds its default
(:attr:`~qkv.inference.TranslatorBase.decoding`); a call changes it with
:meth:`Decoding.replace`, which returns a new value and never mutates the old one.

>>> from qkv.inference import Decoding
>>> d = Decoding(beam_size=4, length_penalty=0.6, no_repeat_ngram=3)
>>> d.replace(n_best=2).n_best
2
>>> Decoding().replace(n_best=3).beam_size      # n-best needs a beam at least that wide
3
>>> Decoding().output_limit(7)                  # the decode length rule: 2 * 7 + 10
24

Three lengths, three names: the *decode length* (how many tokens a translation may have:
:attr:`Decoding.max_output_len`, else the per-sentence rule :func:`default_output_len`; the
``max_output_len`` of :func:`qkv.decoding.generate`), the *training pair limit*
(``TrainConfig.max_pair_len``: longer pairs are not trained on) and the *position table*
(``Seq2SeqConfig.max_len``, the book's ``max_len``: a learned table cannot encode more
positions; :func:`qkv.inference.position_limits`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import SettingError

__all__ = ["EARLY_STOPPING", "Decoding", "default_max_len", "default_output_len"]

#: the values of :attr:`Decoding.early_stopping`
EARLY_STOPPING: tuple[bool | str, ...] = (True, False, "never")


def default_output_len(src_len: int) -> int:
    """The decode length rule: a translation of a ``src_len``-token source (``<eos>`` counted)
    gets at most ``2 * src_len + 10`` tokens."""
    return 2 * src_len + 10


#: the rule's old name (``max_len`` is a model's position table everywhere else in qkv)
default_max_len = default_output_len


def _int(key: str, value: object, minimum: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        more = " or None" if optional else ""
        raise SettingError(key, f"expected an int >= {minimum}{more}, got {value!r}")


@dataclass(frozen=True)
class Decoding:
    """Every option of turning a source into its translation.

    Attributes:
        beam_size: 1 for greedy search, else the beam width ``K``.
        length_penalty: ``alpha`` of the beam score ``sum(log p) / length ** alpha``.
        no_repeat_ngram: ``n > 0``: never generate a token that would repeat an n-gram of the
            translation (fairseq's ``--no-repeat-ngram-size``); 0: nothing blocked.
        n_best: translations returned per source, best first (at most ``beam_size``).
        max_output_len: the most tokens of every translation (``<eos>`` counted); None: the
            decode length rule, each source's own :func:`default_output_len`, so a translation
            never depends on the sources decoded with it.
        output_len_cap: with ``max_output_len=None``, the rule's length is capped at this
            (training's validation caps it at the run's longest pair); None: no cap.
        max_tokens: the token budget of one batch: source tokens (``<eos>`` counted) times
            the beam. Batching never changes a translation, only the speed.
        chosen_on: where a trained run chose this decoding (``"1000 validation sentences,
            BLEU 39.06"``), recorded in ``decoding.json``; None for any other.
        early_stopping: when a beam search ends a sentence, as ``transformers`` names it:
            True (qkv's rule, fairseq's and CTranslate2's) once it has ``beam_size`` finished
            translations; False (``transformers``' default) once its best live hypothesis,
            scored at its current length, can no longer beat the worst of its
            ``beam_size`` best finished ones; ``"never"``: the same, scored at the decode
            length when ``length_penalty > 0``.
        forced_eos: the last token a translation may have (its decode length) is ``<eos>``,
            scored 0 (``transformers``' ``forced_eos_token_id``): a translation cut at the
            limit ends with ``<eos>`` and has one token less; False: it stops as it is.
        renormalize: the log-probabilities normalised again after the tokens never generated
            are removed (``transformers``' ``renormalize_logits``); changes beam scores only.
        suppress: more token ids never generated (a model's bad words), besides ``<pad>``
            and the decoder's start token.

    Raises:
        SettingError: (a ``ValueError``) a value out of range, named by its field.
    """

    beam_size: int = 1
    length_penalty: float = 1.0
    no_repeat_ngram: int = 0
    n_best: int = 1
    max_output_len: int | None = None
    output_len_cap: int | None = None
    max_tokens: int = 4096
    chosen_on: str | None = None
    early_stopping: bool | str = True
    forced_eos: bool = False
    renormalize: bool = False
    suppress: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _int("beam_size", self.beam_size, 1)
        _int("n_best", self.n_best, 1)
        if self.n_best > self.beam_size:
            raise SettingError(
                "n_best", f"expected at most beam_size ({self.beam_size}), got {self.n_best}"
            )
        lp = self.length_penalty
        if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp):
            raise SettingError("length_penalty", f"expected a finite number, got {lp!r}")
        object.__setattr__(self, "length_penalty", float(lp))
        _int("no_repeat_ngram", self.no_repeat_ngram, 0)
        _int("max_output_len", self.max_output_len, 1, optional=True)
        _int("output_len_cap", self.output_len_cap, 1, optional=True)
        _int("max_tokens", self.max_tokens, 1)
        if self.chosen_on is not None and not isinstance(self.chosen_on, str):
            raise SettingError("chosen_on", f"expected a str or None, got {self.chosen_on!r}")
        if self.early_stopping not in EARLY_STOPPING or not isinstance(
            self.early_stopping, (bool, str)
        ):
            raise SettingError(
                "early_stopping", f"expected True, False or 'never', got {self.early_stopping!r}"
            )
        for key in ("forced_eos", "renormalize"):
            if not isinstance(getattr(self, key), bool):
                raise SettingError(key, f"expected a bool, got {getattr(self, key)!r}")
        ids = self.suppress
        if isinstance(ids, (str, bytes)) or not isinstance(ids, (tuple, list)):
            raise SettingError("suppress", f"expected a list of token ids, got {ids!r}")
        for i in ids:
            _int("suppress", i, 0)
        object.__setattr__(self, "suppress", tuple(sorted(set(ids))))

    # -------------------------------------------------------------- changed copies
    def replace(self, **overrides: Any) -> Decoding:
        """A copy with ``overrides`` applied (checked); ``self`` is left as it is.

        An override of None keeps the current value, so options a user left out (a flag not
        given, a keyword left at None) pass through. Asking for ``n_best`` wider than the beam
        without giving ``beam_size`` widens the beam to ``n_best``.

        Raises:
            TypeError: an unknown option.
            SettingError: a value out of range.
        """
        known = {f.name for f in dataclasses.fields(self)}
        for key in overrides:
            if key not in known:
                hint = (
                    " (the decode length is max_output_len; max_len is the model's position "
                    "table, max_pair_len the training pair limit)"
                    if key == "max_len"
                    else ""
                )
                raise TypeError(
                    f"{key}: not a decoding option; expected one of {sorted(known)}{hint}"
                )
        given = {k: v for k, v in overrides.items() if v is not None}
        if not given:
            return self
        n_best = given.get("n_best", self.n_best)
        if "beam_size" not in given and isinstance(n_best, int) and n_best > self.beam_size:
            given["beam_size"] = n_best
        return dataclasses.replace(self, **given)

    def resolve(self, decoding: Decoding | None = None, **overrides: Any) -> Decoding:
        """``decoding`` (or ``self`` when None) with ``overrides`` applied: what one call of a
        translator decodes with, from its default, an optional whole value, and keywords."""
        if decoding is not None and not isinstance(decoding, Decoding):
            raise TypeError(f"decoding: expected a qkv Decoding or None, got {decoding!r}")
        return (decoding or self).replace(**overrides)

    # -------------------------------------------------------------- the decode length rule
    def output_limit(self, src_len: int, positions: int | None = None) -> int:
        """The most tokens (``<eos>`` counted) of the translation of a ``src_len``-token
        source: :attr:`max_output_len`, else :func:`default_output_len` capped at
        :attr:`output_len_cap`; never more than ``positions`` (a learned table's size)."""
        if self.max_output_len is not None:
            limit = self.max_output_len
        else:
            limit = default_output_len(src_len)
            if self.output_len_cap is not None:
                limit = min(limit, self.output_len_cap)
        return limit if positions is None else min(limit, positions)

    # -------------------------------------------------------------- the search
    def search_options(self) -> dict[str, Any]:
        """The keywords of :func:`qkv.decoding.generate` this value sets (all but the length,
        which is per sentence: :meth:`output_limit`)."""
        return {
            "beam_size": self.beam_size,
            "length_penalty": self.length_penalty,
            "n_best": self.n_best,
            "no_repeat_ngram": self.no_repeat_ngram,
            "early_stopping": self.early_stopping,
            "forced_eos": self.forced_eos,
            "renormalize": self.renormalize,
            "suppress": self.suppress,
        }

    def beyond_greedy(self) -> dict[str, Any]:
        """The options set past plain greedy search (a beam, n-best, blocked n-grams, forced
        ``<eos>``, suppressed ids), with their values: what an engine that decodes greedily
        must refuse. The options of the beam's score and end (``length_penalty``,
        ``early_stopping``, ``renormalize``) change nothing in greedy search."""
        plain = Decoding().search_options()
        beam_only = ("length_penalty", "early_stopping", "renormalize")
        return {
            k: v for k, v in self.search_options().items() if k not in beam_only and v != plain[k]
        }

    @property
    def greedy(self) -> bool:
        """One hypothesis, no beam: greedy search."""
        return self.beam_size == 1 and self.n_best == 1

    def describe(self) -> str:
        """``"greedy"`` or ``"beam 4, length penalty 0.6"`` (and ``", no 3-gram repeated"``,
        ``", early stopping False"`` when it is not qkv's rule)."""
        how = "greedy" if self.beam_size == 1 else f"beam {self.beam_size}, length penalty "
        how += "" if self.beam_size == 1 else f"{self.length_penalty:g}"
        if self.beam_size > 1 and self.early_stopping is not True:
            how += f", early stopping {self.early_stopping}"
        if self.no_repeat_ngram:
            how += f", no {self.no_repeat_ngram}-gram repeated"
        return how

    # -------------------------------------------------------------- decoding.json
    def to_dict(self) -> dict[str, Any]:
        """The value as ``decoding.json`` holds it: every option that differs from the default,
        and always ``beam_size``, ``length_penalty`` and ``no_repeat_ngram``."""
        default = Decoding()
        keep = ("beam_size", "length_penalty", "no_repeat_ngram")
        return {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in dataclasses.fields(self)
            if f.name in keep or getattr(self, f.name) != getattr(default, f.name)
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Decoding:
        """Read ``decoding.json``'s content (None: the default, greedy and nothing blocked).

        Raises:
            TypeError: ``data`` is not a mapping, or names an unknown option.
            SettingError: a value out of range.
        """
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise TypeError(f"decoding: expected a dict, got {type(data).__name__}")
        return cls().replace(**dict(data))

    @classmethod
    def coerce(cls, value: Decoding | Mapping[str, Any] | None) -> Decoding:
        """``value`` as a Decoding: itself, read from a dict (:meth:`from_dict`), or the
        default for None."""
        return value if isinstance(value, Decoding) else cls.from_dict(value)
