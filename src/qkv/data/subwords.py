"""Subword sampling of a SentencePiece model, drawn from a generator of the caller's.

SentencePiece samples segmentations itself (``encode(..., enable_sampling=True)``), but its
generator cannot be made to repeat: since 0.2 its seed is salted per process (the same
``set_random_generator_seed`` gives other draws in another process), so a training run that
sampled with it could not be resumed, nor run again, to the same weights. :class:`SubwordSampler`
draws the same distributions from a :class:`numpy.random.Generator`, on the model's own pieces
and scores, with SentencePiece itself only normalising the text (``normalize``) and listing the
n best segmentations (``nbest_encode``), both deterministic:

* **unigram, all segmentations** (``nbest_size=-1``): forward-filtering backward-sampling over
  the model's lattice (Kudo, 2018): a segmentation ``x`` drawn with probability proportional
  to ``exp(alpha * sum of its pieces' log-probabilities)``; the lattice is SentencePiece's (every
  piece matching at a position, user-defined pieces with their bonus, one unknown node where no
  one-character piece matches, scored 10 below the least piece);
* **unigram, n best** (``nbest_size >= 2``): one of SentencePiece's ``nbest_size`` best
  segmentations, with probability proportional to ``exp(alpha * its score)``;
* **BPE-dropout** (Provilkov et al., 2020): SentencePiece's merges, best score first (leftmost
  on a tie), each skipped with probability ``alpha`` when its turn comes.

Pieces become ids as SentencePiece's ``encode`` makes them: an unknown piece is ``unk`` (a run
of unknown pieces one ``unk``), or its UTF-8 bytes with ``byte_fallback``. With sampling off
(:meth:`SubwordSampler.best`) the lattice's best path and the merges without dropout give
SentencePiece's own ``encode``, which the tests check on real and random text.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence

import numpy as np

__all__ = ["SubwordSampler"]

# SentencePiece's piece types (sentencepiece_model.proto)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}
#: what an unknown node scores below the least piece (SentencePiece's kUnkPenalty)
_UNK_PENALTY = 10.0


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def proto_fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """The ``(number, wire type, value)`` of a protobuf message's top-level fields: a varint
    as an int, a length-delimited field or a fixed-width one as its bytes."""
    i = 0
    while i < len(buf):
        tag, i = _varint(buf, i)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, i = _varint(buf, i)
            yield number, wire, value
        elif wire == 2:
            size, i = _varint(buf, i)
            yield number, wire, buf[i : i + size]
            i += size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            yield number, wire, buf[i : i + width]
            i += width
        else:
            raise ValueError(f"model: not a SentencePiece model (protobuf wire type {wire})")


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def proto_message(fields: Sequence[tuple[int, int, int | bytes]]) -> bytes:
    """A protobuf message of ``(number, wire type, value)`` fields, as :func:`proto_fields`
    reads them (their bytes written back as read)."""
    out = bytearray()
    for number, wire, value in fields:
        out += _varint_bytes(number << 3 | wire)
        if wire == 0:
            out += _varint_bytes(value)  # type: ignore[arg-type]
        elif wire == 2:
            out += _varint_bytes(len(value)) + value  # type: ignore[arg-type, operator]
        else:
            out += value  # type: ignore[operator]
    return bytes(out)


def model_type(model: bytes) -> str:
    """The model type a SentencePiece ``ModelProto`` records (``trainer_spec.model_type``;
    protobuf's default, unigram, when absent), read without the protobuf package."""
    for number, wire, value in proto_fields(model):
        if number == 2 and wire == 2:  # trainer_spec
            for n, w, v in proto_fields(value):  # type: ignore[arg-type]
                if n == 3 and w == 0:  # model_type
                    return _MODEL_TYPES.get(v, f"type {v}")  # type: ignore[arg-type]
    return "unigram"


def _piece_types(model: bytes) -> list[int]:
    """The type of every piece of a SentencePiece ``ModelProto`` (NORMAL when absent)."""
    types = []
    for number, wire, value in proto_fields(model):
        if number == 1 and wire == 2:  # repeated SentencePiece pieces
            kind = _NORMAL
            for n, w, v in proto_fields(value):  # type: ignore[arg-type]
                if n == 3 and w == 0:
                    kind = v  # type: ignore[assignment]
            types.append(kind)
    return types


class SubwordSampler:
    """Sample segmentations of one SentencePiece model (see the module docstring).

    Args:
        sp: the model's ``SentencePieceProcessor``.
        model: the serialized model (its piece types and model type are read from it).

    Ids are the model's own (SentencePiece's ids, before any mapping of the caller's).
    """

    def __init__(self, sp, model: bytes) -> None:
        self._sp = sp
        self.kind = model_type(model)
        types = _piece_types(model)
        n = sp.get_piece_size()
        if len(types) != n:
            raise ValueError(f"model: {len(types)} pieces read, SentencePiece has {n}")
        scores = [sp.get_score(i) for i in range(n)]
        self._scores = scores
        self._unk = sp.unk_id()
        # the pieces a segmentation may use (SentencePiece's pieces_: normal, user-defined,
        # unused; control, unknown and byte pieces never come from text)
        self._pieces = {
            sp.id_to_piece(i): i for i in range(n) if types[i] in (_NORMAL, _USER_DEFINED, _UNUSED)
        }
        self._unused = {i for i in range(n) if types[i] == _UNUSED}
        self._user = {sp.id_to_piece(i) for i in range(n) if types[i] == _USER_DEFINED}
        normal = [scores[i] for i in range(n) if types[i] == _NORMAL] or [0.0]
        self._unk_score = min(normal) - _UNK_PENALTY
        self._max_score = max(normal)
        # every prefix of a piece: a lattice stops looking at longer strings where none is one
        self._prefixes = {p[:k] for p in self._pieces for k in range(1, len(p) + 1)}
        self._bytes = {int(sp.id_to_piece(i)[3:5], 16): i for i in range(n) if types[i] == _BYTE}

    # -- unigram --------------------------------------------------------------------------
    def _lattice(self, s: str) -> list[list[tuple[int, int, float]]]:
        """Every node of SentencePiece's unigram lattice over the normalised ``s``, by the
        position it ends at: ``(begin, id, score)``, in SentencePiece's insertion order."""
        n = len(s)
        ends: list[list[tuple[int, int, float]]] = [[] for _ in range(n + 1)]
        pieces, unused, user, prefixes = self._pieces, self._unused, self._user, self._prefixes
        for i in range(n):
            single = False
            for k in range(1, n - i + 1):
                piece = s[i : i + k]
                if piece not in prefixes:
                    break
                pid = pieces.get(piece)
                if pid is None or pid in unused:
                    continue
                score = k * self._max_score - 0.1 if piece in user else self._scores[pid]
                ends[i + k].append((i, pid, score))
                single = single or k == 1
            if not single:
                ends[i + 1].append((i, self._unk, self._unk_score))
        return ends

    def _viterbi(self, s: str) -> list[tuple[str, int]]:
        ends = self._lattice(s)
        best = [0.0] + [-math.inf] * len(s)
        back: list[tuple[int, int]] = [(0, 0)] * (len(s) + 1)
        for j in range(1, len(s) + 1):
            for i, pid, score in ends[j]:
                if best[i] + score > best[j]:
                    best[j], back[j] = best[i] + score, (i, pid)
        return self._path(s, back)

    def _ffbs(self, s: str, alpha: float, rng: np.random.Generator) -> list[tuple[str, int]]:
        """Forward filtering, backward sampling with the scores scaled by ``alpha``."""
        ends = self._lattice(s)
        n = len(s)
        forward = [0.0] * (n + 1)
        for j in range(1, n + 1):
            terms = [forward[i] + alpha * score for i, _, score in ends[j]]
            top = max(terms)
            forward[j] = top + math.log(sum(math.exp(t - top) for t in terms))
        back: list[tuple[int, int]] = [(0, 0)] * (n + 1)
        j = n
        while j > 0:
            weights = [math.exp(forward[i] + alpha * score - forward[j]) for i, _, score in ends[j]]
            u = rng.random() * sum(weights)
            k, acc = 0, weights[0]
            while acc <= u and k + 1 < len(weights):
                k += 1
                acc += weights[k]
            i, pid, _ = ends[j][k]
            back[j] = (i, pid)
            j = i
        return self._path(s, back)

    @staticmethod
    def _path(s: str, back: list[tuple[int, int]]) -> list[tuple[str, int]]:
        out = []
        j = len(s)
        while j > 0:
            i, pid = back[j]
            out.append((s[i:j], pid))
            j = i
        out.reverse()
        return out

    def _nbest(self, text: str, size: int, alpha: float, rng: np.random.Generator) -> list[int]:
        """One of SentencePiece's ``size`` best segmentations, drawn by ``exp(alpha * score)``
        (its ids, as SentencePiece's ``encode`` gives them)."""
        nbests = self._sp.nbest_encode(text, nbest_size=size, return_type="proto").nbests
        if not nbests:
            return []
        logits = np.array([alpha * float(x.score) for x in nbests])
        p = np.exp(logits - logits.max())
        k = int(rng.choice(len(p), p=p / p.sum()))
        return [piece.id for piece in nbests[k].pieces]

    # -- BPE ------------------------------------------------------------------------------
    def _bpe(self, s: str, alpha: float, rng: np.random.Generator | None) -> list[tuple[str, int]]:
        """SentencePiece's BPE merges over the normalised ``s``, each skipped with probability
        ``alpha`` (none without ``rng``)."""
        symbols: list[str] = []
        frozen: list[bool] = []
        i = 0
        users = sorted(self._user, key=len, reverse=True)
        while i < len(s):
            match = next((u for u in users if s.startswith(u, i)), None)
            step = len(match) if match else 1
            symbols.append(s[i : i + step])
            frozen.append(match is not None)
            i += step
        n = len(symbols)
        prev, nxt = list(range(-1, n - 1)), [*range(1, n), -1]
        agenda: list[tuple[float, int, int, int]] = []
        merged_from: dict[str, tuple[str, str]] = {}

        def add(left: int, right: int) -> None:
            if left == -1 or right == -1 or frozen[left] or frozen[right]:
                return
            piece = symbols[left] + symbols[right]
            pid = self._pieces.get(piece)
            if pid is None:
                return
            heapq.heappush(agenda, (-self._scores[pid], left, right, len(piece)))
            if pid in self._unused:
                merged_from[piece] = (symbols[left], symbols[right])

        for k in range(1, n):
            add(k - 1, k)
        while agenda:
            _, left, right, size = heapq.heappop(agenda)
            if (
                not symbols[left]
                or not symbols[right]
                or len(symbols[left]) + len(symbols[right]) != size
            ):
                continue
            if rng is not None and rng.random() < alpha:
                continue
            symbols[left] += symbols[right]
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            symbols[right] = ""
            add(prev[left], left)
            add(left, nxt[left])
        out: list[tuple[str, int]] = []

        def resegment(piece: str) -> None:
            pid = self._pieces.get(piece, self._unk)
            if pid in self._unused and piece in merged_from:
                resegment(merged_from[piece][0])
                resegment(merged_from[piece][1])
            else:
                out.append((piece, pid))

        k = 0 if n else -1
        while k != -1:
            resegment(symbols[k])
            k = nxt[k]
        return out

    # -- ids ------------------------------------------------------------------------------
    def _ids(self, pieces: list[tuple[str, int]]) -> list[int]:
        """Pieces to ids as SentencePiece's ``encode``: an unknown piece its UTF-8 bytes (with
        byte fallback) or ``unk``, a run of unknown pieces one ``unk``."""
        out: list[int] = []
        prev_unk = False
        for piece, pid in pieces:
            unknown = pid == self._unk
            if unknown and self._bytes:
                out.extend(self._bytes[b] for b in piece.encode("utf-8"))
            elif not (unknown and prev_unk):
                out.append(pid)
            prev_unk = unknown
        return out

    def best(self, text: str) -> list[int]:
        """The one best segmentation with this module's own search (SentencePiece's
        ``encode``, which the tests check it against)."""
        s = self._sp.normalize(text)
        return self._ids(self._bpe(s, 0.0, None) if self.kind == "bpe" else self._viterbi(s))

    def sample(
        self, texts: Sequence[str], *, alpha: float, nbest_size: int, rng: np.random.Generator
    ) -> list[list[int]]:
        """One sampled segmentation of each text (see the module docstring), drawing from
        ``rng`` in text order."""
        out = []
        for text in texts:
            if self.kind == "bpe":
                out.append(self._ids(self._bpe(self._sp.normalize(text), alpha, rng)))
            elif nbest_size == -1:
                out.append(self._ids(self._ffbs(self._sp.normalize(text), alpha, rng)))
            else:
                out.append(self._nbest(text, nbest_size, alpha, rng))
        return out
