"""Vocabulary: tokens <-> ids with fixed special ids.

Every qkv vocabulary (and every qkv tokenizer, SentencePiece included) uses the same special ids,
so batching and models never need to ask:

======  ==  ==========================================
token   id  use
======  ==  ==========================================
<pad>   0   padding (``nn.Embedding(padding_idx=0)``)
<bos>   1   first decoder input
<eos>   2   end of every sequence
<unk>   3   any token not in the vocabulary
======  ==  ==========================================

The book reserves ``<unk>`` at 0 and ``<pad>`` at 1; qkv puts ``<pad>`` at 0 so that a zero
tensor is all padding.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["BOS", "EOS", "PAD", "SPECIALS", "UNK", "Vocab"]

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)


class Vocab:
    """A token <-> id mapping with ``<pad>``=0, ``<bos>``=1, ``<eos>``=2, ``<unk>``=3.

    Args:
        tokens: the ordinary tokens, in id order from 4 on (duplicates and specials are
            rejected).
        reserved: further reserved tokens placed right after the four specials (e.g. ``<sep>``).
    """

    pad_id = 0
    bos_id = 1
    eos_id = 2
    unk_id = 3

    def __init__(self, tokens: Iterable[str] = (), reserved: Sequence[str] = ()) -> None:
        self.reserved = tuple(reserved)
        itos = list(SPECIALS) + list(self.reserved)
        for t in itos[len(SPECIALS) :]:
            if not isinstance(t, str) or not t:
                raise TypeError(f"reserved must hold non-empty strings, got {t!r}")
        for t in tokens:
            if not isinstance(t, str) or not t:
                raise TypeError(f"tokens must be non-empty strings, got {t!r}")
            itos.append(t)
        self._itos = itos
        self._stoi = {t: i for i, t in enumerate(itos)}
        if len(self._stoi) != len(itos):
            dup = [t for t, c in Counter(itos).items() if c > 1][:5]
            raise ValueError(f"tokens must be distinct and not special, got duplicates {dup}")

    @classmethod
    def build(
        cls,
        token_lists: Iterable[Sequence[str]],
        min_freq: int = 1,
        max_size: int | None = None,
        reserved: Sequence[str] = (),
    ) -> Vocab:
        """Count tokens and keep those seen at least ``min_freq`` times.

        Tokens are ordered by decreasing count, ties broken by the token itself, so the same
        data always gives the same ids.

        Args:
            token_lists: an iterable of token sequences (sentences).
            min_freq: minimum count of a kept token (the book uses 2).
            max_size: keep at most this many ordinary tokens (the most frequent), or None.
            reserved: extra reserved tokens after the four specials.
        """
        if not isinstance(min_freq, int) or min_freq < 1:
            raise ValueError(f"min_freq must be an int >= 1, got {min_freq!r}")
        if max_size is not None and (not isinstance(max_size, int) or max_size < 0):
            raise ValueError(f"max_size must be an int >= 0 or None, got {max_size!r}")
        counts: Counter[str] = Counter()
        for toks in token_lists:
            counts.update(toks)
        skip = set(SPECIALS) | set(reserved) | {""}
        kept = sorted(
            ((t, c) for t, c in counts.items() if c >= min_freq and t not in skip),
            key=lambda tc: (-tc[1], tc[0]),
        )
        if max_size is not None:
            kept = kept[:max_size]
        return cls((t for t, _ in kept), reserved=reserved)

    def __len__(self) -> int:
        return len(self._itos)

    def __contains__(self, token: object) -> bool:
        return token in self._stoi

    def __getitem__(self, token: str) -> int:
        """The id of ``token``, or ``unk_id`` when it is not in the vocabulary."""
        return self._stoi.get(token, self.unk_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self._itos == other._itos

    def __hash__(self) -> int:
        return hash(tuple(self._itos))

    def __repr__(self) -> str:
        return f"Vocab(size={len(self)}, first={self._itos[4:9]})"

    @property
    def tokens(self) -> list[str]:
        """All tokens in id order, specials first."""
        return list(self._itos)

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Token strings -> ids (unknown tokens -> ``unk_id``)."""
        get, unk = self._stoi.get, self.unk_id
        return [get(t, unk) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Ids -> token strings.

        Raises:
            ValueError: an id outside ``[0, len(self))``.
        """
        itos, n = self._itos, len(self._itos)
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < n:
                raise ValueError(f"ids must lie in [0, {n}), got {i}")
            out.append(itos[i])
        return out

    def to_dict(self) -> dict:
        """A JSON-serialisable dict; :meth:`from_dict` rebuilds an equal vocabulary."""
        return {
            "type": "qkv.Vocab",
            "reserved": list(self.reserved),
            "tokens": self._itos[len(SPECIALS) + len(self.reserved) :],
        }

    @classmethod
    def from_dict(cls, d: dict) -> Vocab:
        """Rebuild a vocabulary saved by :meth:`to_dict`."""
        if not isinstance(d, dict) or "tokens" not in d:
            raise ValueError(f"d must be a dict from Vocab.to_dict with 'tokens', got {d!r:.80}")
        return cls(d["tokens"], reserved=d.get("reserved", ()))

    def save(self, path: str | Path) -> None:
        """Write the vocabulary as JSON to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        """Read a vocabulary written by :meth:`save`."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
