"""Deterministic train/valid/test splits that evaluation can trust.

:func:`split_pairs` groups pairs by their source sentence, so that every translation of one
sentence lands in the same part (Tatoeba has many sentences with several translations: a plain
random split would put a test sentence's twin in the training set). Sources are compared after
:func:`normalized_source` (Unicode NFC, case folded, no-break spaces as spaces, whitespace
collapsed, no space before punctuation), because training normalises text later: ``"Go."``,
``"go ."`` and ``"GO\u00a0!"``-style variants would otherwise land in different parts and a test
sentence would be seen in training. ``key=`` replaces that comparison. Groups are ordered by a
seeded hash of their (smallest) raw source text, which makes the split independent of the
file's line order, and cut to the requested sizes.

The result is a :class:`Split`: the index lists plus a fingerprint of the data they index,
JSON-serialisable, so a run saves it and evaluation applies exactly the same split -- and is
told, instead of silently misled, when the data changed.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "SPLIT_VERSION",
    "Split",
    "fingerprint",
    "group_hashes",
    "normalized_source",
    "split_pairs",
    "split_parts",
]

#: Version of the saved format. 1: no ``version``/``grouping`` fields, sources grouped by their
#: raw text. 2: ``grouping`` says how sources were compared (``"normalized"``, ``"custom"``).
SPLIT_VERSION = 2

_NBSP = str.maketrans({"\u00a0": " ", "\u202f": " ", "\u2007": " "})
_SPACES = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT = re.compile(r" (?=[^\w\s])")


def normalized_source(text: str) -> str:
    """The default grouping key of :func:`split_pairs`: two sources that any normaliser would
    make equal get the same key.

    Unicode NFC, case folded, no-break spaces (U+00A0, U+202F, U+2007) as spaces, every run of
    whitespace one space, ends stripped, and no space before a punctuation mark or symbol, so
    ``"Go."``, ``"go ."``, ``"GO\u00a0."`` and ``" go  . "`` share the key ``"go."``.
    """
    text = unicodedata.normalize("NFC", text).casefold()
    text = unicodedata.normalize("NFC", text).translate(_NBSP)
    text = _SPACES.sub(" ", text).strip()
    return _SPACE_BEFORE_PUNCT.sub("", text)


def fingerprint(pairs: Sequence[tuple[str, str]]) -> str:
    """A short hex digest of the pairs, in order (BLAKE2b, 16 bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for s, t in pairs:
        h.update(s.encode("utf-8", "surrogatepass"))
        h.update(b"\t")
        h.update(t.encode("utf-8", "surrogatepass"))
        h.update(b"\n")
    return h.hexdigest()


@dataclass(frozen=True)
class Split:
    """Which pairs are for training, validation and testing.

    Attributes:
        n: number of pairs the split was made for.
        seed: the seed that ordered the groups.
        fingerprint: :func:`fingerprint` of those pairs.
        train, valid, test: sorted indices into the pairs; disjoint, covering ``range(n)``.
        grouping: how sources were compared: ``"normalized"`` (:func:`normalized_source`, the
            default), ``"custom"`` (a ``key=`` function) or ``"raw"`` (the exact text; splits
            saved before version 2, which may put variants of a test sentence in training).
    """

    n: int
    seed: int
    fingerprint: str
    train: tuple[int, ...]
    valid: tuple[int, ...]
    test: tuple[int, ...]
    grouping: str = "normalized"

    def apply(
        self, pairs: Sequence[tuple[str, str]], check: bool = True
    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]:
        """Return ``(train_pairs, valid_pairs, test_pairs)``.

        Raises:
            ValueError: ``pairs`` are not the pairs the split was made for (length or, with
                ``check``, fingerprint differs).
        """
        if len(pairs) != self.n:
            raise ValueError(f"pairs must have the split's length {self.n}, got {len(pairs)}")
        if check and fingerprint(pairs) != self.fingerprint:
            raise ValueError(
                f"pairs differ from the data this split was made for (fingerprint "
                f"{fingerprint(pairs)} != {self.fingerprint}); re-split or pass check=False"
            )
        return (
            [pairs[i] for i in self.train],
            [pairs[i] for i in self.valid],
            [pairs[i] for i in self.test],
        )

    def to_dict(self) -> dict:
        """A JSON-serialisable dict; :meth:`from_dict` rebuilds an equal split."""
        return {
            "type": "qkv.Split",
            "version": SPLIT_VERSION,
            "grouping": self.grouping,
            "n": self.n,
            "seed": self.seed,
            "fingerprint": self.fingerprint,
            "train": list(self.train),
            "valid": list(self.valid),
            "test": list(self.test),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Split:
        """Rebuild a split from :meth:`to_dict`, checking that the parts partition ``range(n)``.

        Splits saved before version 2 (no ``version`` field) load with ``grouping="raw"``; a
        newer version than this qkv knows is refused.
        """
        if not isinstance(d, dict):
            raise ValueError(f"d must be a dict from Split.to_dict, got {type(d).__name__}")
        version = d.get("version", 1)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"d: version must be an int >= 1, got {version!r}")
        if version > SPLIT_VERSION:
            raise ValueError(
                f"d: a split of version {version} needs a newer qkv; this one reads versions "
                f"1 to {SPLIT_VERSION}"
            )
        grouping = "raw" if version == 1 else d.get("grouping")
        if grouping not in ("raw", "normalized", "custom"):
            raise ValueError(
                f"d: grouping must be 'raw', 'normalized' or 'custom', got {grouping!r}"
            )
        try:
            split = cls(
                n=int(d["n"]),
                seed=int(d["seed"]),
                fingerprint=str(d["fingerprint"]),
                train=tuple(int(i) for i in d["train"]),
                valid=tuple(int(i) for i in d["valid"]),
                test=tuple(int(i) for i in d["test"]),
                grouping=grouping,
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"d must be a dict from Split.to_dict, got an error: {e!r}") from None
        everything = sorted(split.train + split.valid + split.test)
        if everything != list(range(split.n)):
            raise ValueError("d: train, valid and test must partition range(n)")
        return split

    def save(self, path: str | Path) -> None:
        """Write the split as JSON to the file ``path`` (its folder created if needed)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict()), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Split:
        """Read a split written by :meth:`save`."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def __repr__(self) -> str:
        return (
            f"Split(n={self.n}, seed={self.seed}, train={len(self.train)}, "
            f"valid={len(self.valid)}, test={len(self.test)}, grouping={self.grouping!r})"
        )


def _size(frac: float | int, n: int, name: str) -> int:
    if isinstance(frac, bool) or not isinstance(frac, (int, float)):
        raise TypeError(f"{name} must be a fraction in [0, 1) or a count, got {frac!r}")
    if isinstance(frac, int):
        if not 0 <= frac <= n:
            raise ValueError(f"{name} as a count must lie in [0, {n}], got {frac}")
        return frac
    if not 0.0 <= frac < 1.0:
        raise ValueError(f"{name} as a fraction must lie in [0, 1), got {frac}")
    return round(frac * n)


def split_pairs(
    pairs: Sequence[tuple[str, str]],
    valid: float | int = 0.1,
    test: float | int = 0.1,
    seed: int = 0,
    *,
    key: Callable[[str], str] | None = None,
) -> Split:
    """Split ``pairs`` into train/valid/test, grouping pairs that share a source sentence.

    Args:
        pairs: the ``(source, target)`` pairs.
        valid, test: a fraction of the pairs (float) or a number of pairs (int). Parts are
            filled with whole source groups, so sizes can exceed the target by at most one
            group.
        seed: orders the groups; the same pairs and seed always give the same split.
        key: maps a source to the text that decides which sources are "the same sentence";
            default :func:`normalized_source` (case, Unicode form, no-break and repeated spaces
            and spaces before punctuation ignored). Pass ``lambda s: s`` to group by the exact
            text, or your normaliser (e.g. ``Normalizer.book()``).

    Returns:
        a :class:`Split`; ``split.apply(pairs)`` gives the three lists.
    """
    n = len(pairs)
    if n == 0:
        raise ValueError("pairs must not be empty")
    if not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if key is not None and not callable(key):
        raise TypeError(f"key must be a function str -> str or None, got {type(key).__name__}")
    n_valid, n_test = _size(valid, n, "valid"), _size(test, n, "test")
    if n_valid + n_test > n:
        raise ValueError(f"valid + test must not exceed the {n} pairs, got {n_valid} + {n_test}")
    group_key = normalized_source if key is None else key
    groups: dict[str, list[int]] = {}
    # each group is ordered by its smallest raw source: for data without variants this is the
    # source itself, so such a split is the one grouping by the exact text makes
    first: dict[str, str] = {}
    for i, (s, _) in enumerate(pairs):
        g = group_key(s)
        if not isinstance(g, str):
            raise TypeError(f"key must return a str, got {type(g).__name__} for {s!r}")
        groups.setdefault(g, []).append(i)
        if g not in first or s < first[g]:
            first[g] = s
    salt = str(seed).encode() + b"\x00"

    def rank(g: str) -> tuple[bytes, str]:
        src = first[g]
        digest = hashlib.blake2b(salt + src.encode("utf-8", "surrogatepass"), digest_size=8)
        return digest.digest(), src

    order = sorted(groups, key=rank)
    test_idx: list[int] = []
    valid_idx: list[int] = []
    train_idx: list[int] = []
    for g in order:
        if len(test_idx) < n_test:
            test_idx.extend(groups[g])
        elif len(valid_idx) < n_valid:
            valid_idx.extend(groups[g])
        else:
            train_idx.extend(groups[g])
    return Split(
        n=n,
        seed=seed,
        fingerprint=fingerprint(pairs),
        train=tuple(sorted(train_idx)),
        valid=tuple(sorted(valid_idx)),
        test=tuple(sorted(test_idx)),
        grouping="normalized" if key is None else "custom",
    )


# ---------------------------------------------------------------------------- in a stream
#: the parts :func:`split_parts` gives each pair
TRAIN, VALID, TEST = 0, 1, 2


def group_hashes(sources: Sequence[str], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """What :func:`split_parts` needs of each source, so that a corpus too large to hold can
    be split a chunk at a time with the result of :func:`split_pairs` (default grouping).

    Returns:
        ``(keys, ranks)``: ``(n, 2)`` uint64, a 128-bit BLAKE2b of each source's
        :func:`normalized_source` (its group); ``(n,)`` uint64, the seeded 64-bit BLAKE2b of the
        raw source that orders the groups, as a big-endian number (so numbers compare as the
        digests' bytes do).
    """
    salt = str(seed).encode() + b"\x00"
    keys, ranks = bytearray(), bytearray()
    for s in sources:
        keys += hashlib.blake2b(normalized_source(s).encode("utf-8", "surrogatepass"),
                                digest_size=16).digest()  # fmt: skip
        ranks += hashlib.blake2b(salt + s.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return (
        np.frombuffer(bytes(keys), dtype=np.uint64).reshape(-1, 2),
        np.frombuffer(bytes(ranks), dtype=">u8").astype(np.uint64),
    )


def _rank(source: str, seed: int) -> int:
    salt = str(seed).encode() + b"\x00"
    digest = hashlib.blake2b(salt + source.encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def split_parts(
    keys: np.ndarray,
    ranks: np.ndarray,
    valid: float | int,
    test: float | int,
    seed: int,
    smallest: Callable[[list[np.ndarray]], list[str]],
) -> np.ndarray:
    """The split of :func:`split_pairs` (default grouping) from :func:`group_hashes` arrays:
    ``(n,)`` int8 of :data:`TRAIN`, :data:`VALID`, :data:`TEST` per pair.

    A group is ordered by its smallest raw source; where its pairs' sources differ (``"Go."``
    and ``"go ."``) or two groups' digests tie, ``smallest`` is asked for the text: given the
    pair indices of some groups, it returns each group's smallest raw source. Only those
    groups' sources are read; everything else is arrays of ``n`` numbers.
    """
    n = len(ranks)
    if n == 0:
        raise ValueError("pairs must not be empty")
    n_valid, n_test = _size(valid, n, "valid"), _size(test, n, "test")
    if n_valid + n_test > n:
        raise ValueError(f"valid + test must not exceed the {n} pairs, got {n_valid} + {n_test}")
    order = np.lexsort((keys[:, 1], keys[:, 0]))
    sk = keys[order]
    starts = np.flatnonzero(np.r_[True, (sk[1:] != sk[:-1]).any(axis=1)])
    del sk
    sizes = np.diff(np.r_[starts, n])
    sr = ranks[order]
    lo, hi = np.minimum.reduceat(sr, starts), np.maximum.reduceat(sr, starts)
    del sr

    def members(groups: list[int]) -> list[np.ndarray]:
        return [np.sort(order[starts[g] : starts[g] + sizes[g]]) for g in groups]

    text: dict[int, str] = {}
    mixed = np.flatnonzero(lo != hi).tolist()  # sources that differ: the smallest one's rank
    if mixed:
        text.update(zip(mixed, smallest(members(mixed))))
        lo[mixed] = np.array([_rank(text[g], seed) for g in mixed], dtype=np.uint64)
    gorder = np.argsort(lo, kind="stable")
    sorted_lo = lo[gorder]
    tied = np.flatnonzero(sorted_lo[1:] == sorted_lo[:-1])  # equal digests: by the text
    if len(tied):
        need = sorted({int(gorder[i]) for i in tied} | {int(gorder[i + 1]) for i in tied})
        fetch = [g for g in need if g not in text]
        if fetch:
            text.update(zip(fetch, smallest(members(fetch))))
        pos = np.unique(np.r_[tied, tied + 1])
        for value in np.unique(sorted_lo[pos]):
            run = pos[sorted_lo[pos] == value]
            gorder[run] = sorted(gorder[run].tolist(), key=text.__getitem__)
    sizes_o = sizes[gorder]
    excl = np.cumsum(sizes_o) - sizes_o
    kt = int(np.searchsorted(excl, n_test, side="left"))
    base = int(excl[kt]) if kt < len(excl) else 0
    kv = kt + int(np.searchsorted(excl[kt:] - base, n_valid, side="left"))
    group_part = np.full(len(starts), TRAIN, dtype=np.int8)
    group_part[gorder[:kt]] = TEST
    group_part[gorder[kt:kv]] = VALID
    parts = np.empty(n, dtype=np.int8)
    parts[order] = np.repeat(group_part, sizes)
    return parts
