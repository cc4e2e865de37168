"""Token-budget batches with length bucketing; reproducible, resumable and shardable.

:class:`TokenBatcher` turns encoded pairs into padded :class:`Batch` es:

* **Token budget.** A batch of ``B`` examples costs ``B * max(Ls, Lt)`` padded positions, and
  never more than ``max_tokens``; ``max_batch_size`` caps ``B`` as well.
* **Bucketing.** Examples are sorted by length before they are cut into batches, so a batch
  holds sentences of similar length and little padding. With ``shuffle=True`` the examples of
  equal length are ordered at random and the batches are visited in random order, both drawn
  from ``(seed, epoch)``: the same seed and epoch always give the same batches.
* **Resumable.** ``state_dict()`` is the data position ``{"epoch", "batch_index", ...}`` (the
  number of batches already handed out in that epoch); a checkpoint stores it and
  ``load_state_dict`` makes the next iteration yield exactly the batches that remained.
* **Resampled.** With ``resample`` (subword sampling while training), every epoch's batches
  are cut from that epoch's ids, ``resample(epoch)``; an example whose resampled side would not
  fit (``max_pair_len``, ``max_tokens``) keeps its own ids that epoch, so the examples kept are
  the same every epoch. A resumed epoch asks for its ids again: a ``resample`` that draws from
  its epoch alone (a seed made of it) resumes exactly.
* **Sharded.** With ``rank``/``world_size`` (default: the ``RANK``/``WORLD_SIZE`` that torchrun
  sets) every rank builds the same epoch plan and takes every ``world_size``-th batch. Like
  ``DistributedSampler``, the plan is padded to a multiple of ``world_size`` by repeating its
  first batches (wrapping around), so every example is seen every epoch (a cut would drop the
  same longest batches every epoch when ``shuffle=False``) and all ranks take the same number
  of steps; at most ``world_size - 1`` batches are seen twice in an epoch.

Teacher forcing as in the book: the target ``y_1 .. y_n`` gives ``tgt_in = <bos> y_1 .. y_n``
and ``tgt_out = y_1 .. y_n <eos>``, both ``n + 1`` long; the source gets ``<eos>`` appended
unless ``src_eos=False``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from .vocab import Vocab

__all__ = ["Batch", "TokenBatcher"]


@dataclass
class Batch:
    """One padded batch. ``B`` examples, ``Ls``/``Lt`` the longest source/target in it.

    Attributes:
        src: ``(B, Ls)`` int64 source ids, ``<pad>`` (0) after ``src_valid_lens``.
        src_valid_lens: ``(B,)`` int64 number of real source tokens (``<eos>`` included).
        tgt_in: ``(B, Lt)`` int64 decoder input, ``<bos>`` then the target.
        tgt_out: ``(B, Lt)`` int64 decoder target, the target then ``<eos>``.
        tgt_valid_lens: ``(B,)`` int64 number of real positions of ``tgt_in``/``tgt_out``.
        indices: ``(B,)`` int64 positions of the examples in the batcher's input lists.
    """

    src: Tensor
    src_valid_lens: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    tgt_valid_lens: Tensor
    indices: Tensor

    def __len__(self) -> int:
        return int(self.src.shape[0])

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) target tokens, the usual denominator of a per-token loss."""
        return int(self.tgt_valid_lens.sum())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy with every tensor on ``device``."""
        return Batch(
            **{
                f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
                for f in fields(self)
            }
        )


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an int, got {value!r}") from None


class TokenBatcher:
    """Batches of encoded pairs under a token budget (see the module docstring).

    Args:
        src_ids, tgt_ids: aligned lists of token-id lists, without ``<bos>``/``<eos>`` (as from
            :func:`qkv.data.encode_pairs`), or columns of a prepared corpus
            (:class:`qkv.data.prepared.TokenColumn`: the lengths an array, each sequence read
            from disk only when its batch is padded).
        max_tokens: budget of one batch in padded positions, ``B * max(Ls, Lt) <= max_tokens``.
        max_batch_size: at most this many examples per batch, or None.
        max_pair_len: examples whose source or target (with ``<eos>``/``<bos>``) is longer
            are dropped (counted in ``n_dropped``), or truncated when ``truncate=True``; None
            keeps all.
        truncate: truncate long examples to ``max_pair_len`` instead of dropping them (the book's
            ``truncate_pad``; the final ``<eos>`` is kept).
        shuffle: random order within equal lengths and random batch order, from
            ``(seed, epoch)``; False gives batches sorted by length.
        seed: the shuffling seed.
        rank, world_size: this process's shard; None reads ``RANK``/``WORLD_SIZE`` (0 and 1
            when unset).
        src_eos: append ``<eos>`` to every source (the book does).
        pad_id, bos_id, eos_id: special ids (qkv's vocabularies use 0, 1, 2).
        max_len: the old name of ``max_pair_len`` (a ``DeprecationWarning``; ``max_len`` is a
            model's position table everywhere else in qkv).
        resample: ``fn(epoch) -> (src_ids, tgt_ids)``, the ids of every input example for that
            epoch (aligned with ``src_ids``/``tgt_ids``, as subword sampling gives them), or None:
            the same ids every epoch. Which examples are kept is decided from ``src_ids`` and
            ``tgt_ids``; a resampled side that would not fit keeps its own ids that epoch.

    Raises:
        ValueError: an example alone exceeds ``max_tokens`` (raise it, or set
            ``max_pair_len``).
    """

    def __init__(
        self,
        src_ids: Sequence[Sequence[int]],
        tgt_ids: Sequence[Sequence[int]],
        *,
        max_tokens: int = 4096,
        max_batch_size: int | None = None,
        max_pair_len: int | None = None,
        truncate: bool = False,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        src_eos: bool = True,
        pad_id: int = Vocab.pad_id,
        bos_id: int = Vocab.bos_id,
        eos_id: int = Vocab.eos_id,
        max_len: int | None = None,
        resample: Callable[[int], tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]]]
        | None = None,
    ) -> None:
        if max_len is not None:
            if max_pair_len is not None:
                raise TypeError("max_len: the old name of max_pair_len: give max_pair_len alone")
            warnings.warn(
                "TokenBatcher(max_len=) is the old name of max_pair_len= (max_len is a model's "
                "position table)",
                DeprecationWarning,
                stacklevel=2,
            )
            max_pair_len = max_len
        _check_settings(len(src_ids), len(tgt_ids), max_tokens, max_batch_size, max_pair_len, seed)
        world_size = _env_int("WORLD_SIZE", 1) if world_size is None else world_size
        rank = _env_int("RANK", 0) if rank is None else rank
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
        self.max_tokens, self.max_batch_size = max_tokens, max_batch_size
        self.max_pair_len = max_pair_len
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        self.src_eos, self.truncate = src_eos, truncate
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self._src, self._tgt = src_ids, tgt_ids
        self._resample, self._own = resample, (src_ids, tgt_ids)
        self._ids_epoch: int | None = None  # the epoch whose resampled ids are loaded
        n_in = len(src_ids)
        ls, lt, dropped = self._kept_lengths()
        self._n = n_kept = len(ls)
        self.n_dropped = n_in - n_kept
        """Examples dropped for exceeding ``max_pair_len``."""
        if n_kept == 0:
            raise ValueError(
                f"no example fits max_pair_len={max_pair_len}; got {n_in} examples"
                if n_in
                else "src_ids must not be empty"
            )
        self._index, self._dropped_rank = _input_index(dropped, n_in, n_kept)
        del dropped
        ls += 1 if src_eos else 0  # the lengths padded: with <eos>, with <bos>
        lt += 1
        self._ls, self._lt = _compact(ls, lt)
        del ls, lt
        worst = int(max(self._ls.max(), self._lt.max()))
        if worst > max_tokens:
            raise ValueError(
                f"max_tokens={max_tokens} is smaller than the longest example ({worst} tokens); "
                "raise max_tokens or pass max_pair_len to drop or truncate long examples"
            )
        self.epoch = 0
        self.batch_index = 0
        self._batches_cache: tuple[int, _EpochBatches] | None = None

    def _kept_lengths(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The source and target lengths (without ``<eos>``/``<bos>``) of the examples kept
        under ``max_pair_len`` (cut to it with ``truncate``), and the input indices of the ones
        dropped (None: none)."""
        max_pair_len, extra = self.max_pair_len, 1 if self.src_eos else 0
        # lengths in the type they come in (a prepared corpus's uint16) while max_pair_len bounds them
        wide = max_pair_len is None or max_pair_len > np.iinfo(np.uint16).max - 1
        ls = _lengths(self._src, "src_ids", wide)
        lt = _lengths(self._tgt, "tgt_ids", wide)
        if max_pair_len is None:
            return ls, lt, None
        if self.truncate:
            np.minimum(ls, max_pair_len - extra, out=ls)
            np.minimum(lt, max_pair_len - 1, out=lt)
            return ls, lt, None
        fits = (ls <= max_pair_len - extra) & (lt <= max_pair_len - 1)
        if fits.all():
            return ls, lt, None
        return ls[fits], lt[fits], np.flatnonzero(~fits)

    @classmethod
    def from_pairs(
        cls,
        pairs: Sequence[tuple[str, str]],
        src_tokenizer,
        tgt_tokenizer,
        *,
        pre_normalized: bool = False,
        **kwargs,
    ) -> TokenBatcher:
        """Encode ``pairs`` with the tokenizers and batch them (``kwargs`` as the constructor)."""
        from .tokenizers import encode_pairs

        s, t = encode_pairs(pairs, src_tokenizer, tgt_tokenizer, pre_normalized=pre_normalized)
        return cls(s, t, **kwargs)

    @property
    def num_examples(self) -> int:
        """Examples kept (all ranks together)."""
        return self._n

    # -- the epoch plan -------------------------------------------------------------------

    def _all_batches(self, epoch: int) -> _EpochBatches:
        """All batches of ``epoch`` (every rank's), as positions into the kept examples.

        The examples are sorted by ``(max(Ls, Lt), Ls)``, ties in a random order drawn from
        ``(seed, epoch)`` (or in input order without shuffling), cut greedily into batches
        under the budget and visited in a random order drawn next from the same generator.
        Every step works on arrays: a corpus of millions of examples costs a few bytes each.
        """
        n = self._n
        rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
        order, cost = _sorted_by_length(self._ls, self._lt, rng)
        bounds = _cut(cost, self.max_tokens, self.max_batch_size or n)
        del cost
        n_batches = len(bounds) - 1
        visit = rng.permutation(n_batches) if rng is not None else np.arange(n_batches)
        return _EpochBatches(order, bounds, visit)

    def _batches(self, epoch: int) -> _EpochBatches:
        """This rank's batches of ``epoch``."""
        if self._batches_cache is not None and self._batches_cache[0] == epoch:
            return self._batches_cache[1]
        self._batches_cache = None  # the old plan's arrays freed before the new one is built
        if self._resample is not None and self._ids_epoch != epoch:
            self._load_epoch_ids(epoch)
        plan = self._all_batches(epoch)
        if self.world_size > 1:
            if len(plan) < self.world_size:
                raise ValueError(
                    f"world_size={self.world_size} exceeds the {len(plan)} batches of epoch "
                    f"{epoch}; lower max_tokens or use fewer ranks"
                )
            # pad with the plan's first batches (DistributedSampler's wrap-around): every
            # example is seen and every rank takes the same number of steps
            visit = plan.visit
            visit = np.concatenate([visit, visit[: -len(visit) % self.world_size]])
            plan = _EpochBatches(plan.order, plan.bounds, visit[self.rank :: self.world_size])
        self._batches_cache = (epoch, plan)
        return plan

    def _load_epoch_ids(self, epoch: int) -> None:
        """Take ``resample(epoch)``'s ids (a side too long for ``max_pair_len`` or
        ``max_tokens`` keeps its own) and the lengths the epoch's plan is cut from."""
        src, tgt = self._resample(epoch)  # type: ignore[misc]
        own_src, own_tgt = self._own
        if len(src) != len(own_src) or len(tgt) != len(own_tgt):
            raise ValueError(
                f"resample({epoch}) gave {len(src)} and {len(tgt)} examples; expected "
                f"{len(own_src)} of each, aligned with src_ids and tgt_ids"
            )
        extra = 1 if self.src_eos else 0
        top = min(self.max_pair_len or self.max_tokens, self.max_tokens)
        room_s, room_t = top - extra, top - 1
        src = [s if len(s) <= room_s else own_src[i] for i, s in enumerate(src)]
        tgt = [t if len(t) <= room_t else own_tgt[i] for i, t in enumerate(tgt)]
        kept = self._original(np.arange(self._n, dtype=np.int64)).tolist()
        ls = np.fromiter((len(src[i]) + extra for i in kept), dtype=np.int32, count=len(kept))
        lt = np.fromiter((len(tgt[i]) + 1 for i in kept), dtype=np.int32, count=len(kept))
        np.minimum(ls, top, out=ls)  # truncate=True: own ids longer than that are cut
        np.minimum(lt, top, out=lt)
        self._src, self._tgt = src, tgt
        self._ls, self._lt = _compact(ls, lt)
        self._ids_epoch = epoch

    def __len__(self) -> int:
        """Batches of this rank in the current epoch."""
        return len(self._batches(self.epoch))

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch (as ``DistributedSampler.set_epoch``)."""
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch, self.batch_index = epoch, 0

    def __iter__(self) -> Iterator[Batch]:
        """Yield the remaining batches of the current epoch, then move to the next epoch.

        The position advances as each batch is handed out, so ``state_dict()`` taken after
        training on a batch resumes at the batch after it.
        """
        plan = self._batches(self.epoch)
        if self.batch_index >= len(plan):
            self.epoch, self.batch_index = self.epoch + 1, 0
            plan = self._batches(self.epoch)
        while self.batch_index < len(plan):
            positions = plan[self.batch_index]
            self.batch_index += 1
            yield self.collate(positions)
        self.epoch, self.batch_index = self.epoch + 1, 0

    # -- state ----------------------------------------------------------------------------

    def _identity(self) -> dict:
        return {
            "seed": self.seed,
            "num_examples": self._n,
            "max_tokens": self.max_tokens,
            "max_batch_size": self.max_batch_size,
            "world_size": self.world_size,
            "shuffle": self.shuffle,
            "max_pair_len": self.max_pair_len,
            "truncate": self.truncate,
            "src_eos": self.src_eos,
            "resampled": self._resample is not None,
        }

    def state_dict(self) -> dict:
        """The data position, JSON-serialisable: ``epoch``, ``batch_index`` (batches of that
        epoch already handed out) and the settings that fix the plan."""
        return {"epoch": self.epoch, "batch_index": self.batch_index, **self._identity()}

    def load_state_dict(self, state: dict) -> None:
        """Resume at the position ``state`` (from :meth:`state_dict`).

        Raises:
            ValueError: ``state`` was made with settings that give different batches (seed,
                examples, ``max_tokens``, ``max_batch_size``, ``world_size``, ``shuffle``,
                ``max_pair_len``, ``truncate``, ``src_eos``); settings a state does not record (it
                predates them) are not checked.
        """
        if not isinstance(state, dict) or "epoch" not in state or "batch_index" not in state:
            raise ValueError(f"state must be a dict from state_dict(), got {state!r:.100}")
        if "max_len" in state and "max_pair_len" not in state:  # a state of the old name
            state = {**state, "max_pair_len": state["max_len"]}
            del state["max_len"]
        mine = self._identity()
        diff = {k: (state[k], v) for k, v in mine.items() if k in state and state[k] != v}
        if diff:
            text = ", ".join(f"{k}: saved {a!r}, here {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"state comes from a batcher with other settings ({text})")
        epoch, index = int(state["epoch"]), int(state["batch_index"])
        if epoch < 0 or index < 0:
            raise ValueError(f"state: epoch and batch_index must be >= 0, got {epoch}, {index}")
        self.epoch, self.batch_index = epoch, index

    # -- padding --------------------------------------------------------------------------

    def collate(self, positions: np.ndarray) -> Batch:
        """Pad the examples at ``positions`` (into the kept examples) into a :class:`Batch`."""
        positions = np.asarray(positions, dtype=np.int64)
        b = len(positions)
        ls = self._ls[positions].astype(np.int64)
        lt = self._lt[positions].astype(np.int64)
        Ls, Lt = int(ls.max()), int(lt.max())
        src = np.full((b, Ls), self.pad_id, dtype=np.int64)
        tgt_in = np.full((b, Lt), self.pad_id, dtype=np.int64)
        tgt_out = np.full((b, Lt), self.pad_id, dtype=np.int64)
        index = self._original(positions)
        extra = 1 if self.src_eos else 0
        for r, i in enumerate(index.tolist()):
            n, m = int(ls[r]) - extra, int(lt[r]) - 1  # truncated lengths
            s, t = self._src[i][:n], self._tgt[i][:m]
            src[r, :n] = s
            tgt_in[r, 1 : m + 1] = t
            tgt_out[r, :m] = t
            tgt_out[r, m] = self.eos_id
        if self.src_eos:
            src[np.arange(b), ls - 1] = self.eos_id
        tgt_in[:, 0] = self.bos_id
        return Batch(
            src=torch.from_numpy(src),
            src_valid_lens=torch.from_numpy(ls),
            tgt_in=torch.from_numpy(tgt_in),
            tgt_out=torch.from_numpy(tgt_out),
            tgt_valid_lens=torch.from_numpy(lt),
            indices=torch.from_numpy(index),
        )

    def _original(self, positions: np.ndarray) -> np.ndarray:
        """The input indices (int64) of the kept examples at ``positions``."""
        if self._index is not None:
            return self._index[positions].astype(np.int64)
        if self._dropped_rank is not None:
            return positions + np.searchsorted(self._dropped_rank, positions, side="right")
        return positions.copy()


class _EpochBatches:
    """One epoch's batches of one rank: ``order`` (the kept examples sorted), ``bounds``
    (batch ``j`` is ``order[bounds[j]:bounds[j + 1]]``) and ``visit`` (the batches in the order
    they are handed out). Indexing gives a batch's positions; ``len`` the number of batches."""

    __slots__ = ("bounds", "order", "visit")

    def __init__(self, order: np.ndarray, bounds: np.ndarray, visit: np.ndarray) -> None:
        self.order, self.bounds, self.visit = order, bounds, visit

    def __len__(self) -> int:
        return len(self.visit)

    def __getitem__(self, k: int) -> np.ndarray:
        j = int(self.visit[k])
        return self.order[self.bounds[j] : self.bounds[j + 1]]


def _lengths(ids, name: str, wide: bool) -> np.ndarray:
    """The length of every token sequence of ``ids``: a sequence of sequences (as int32), or a
    column with a ``lengths`` array (as :class:`qkv.data.prepared.TokenColumn`: in its own
    type, as int32 when ``wide``). A fresh array either way."""
    lengths = getattr(ids, "lengths", None)
    if lengths is not None:
        out = np.array(lengths, dtype=np.int32 if wide else None)
    else:
        out = np.fromiter((len(x) for x in ids), dtype=np.int32, count=len(ids))
    if out.ndim != 1 or len(out) != len(ids):
        raise ValueError(f"{name}: expected {len(ids)} lengths, got shape {out.shape}")
    return out


def _check_settings(
    n_src: int,
    n_tgt: int,
    max_tokens: object,
    max_batch_size: object,
    max_pair_len: object,
    seed: object,
) -> None:
    """The batcher's arguments that need no reading of the data, checked (ValueError)."""
    if n_src != n_tgt:
        raise ValueError(f"src_ids and tgt_ids must be aligned, got {n_src} and {n_tgt}")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
    if max_batch_size is not None and (not isinstance(max_batch_size, int) or max_batch_size < 1):
        raise ValueError(f"max_batch_size must be an int >= 1 or None, got {max_batch_size!r}")
    if max_pair_len is not None and (not isinstance(max_pair_len, int) or max_pair_len < 2):
        raise ValueError(f"max_pair_len must be an int >= 2 or None, got {max_pair_len!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")


def _input_index(
    dropped: np.ndarray | None, n_in: int, n_kept: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """How a kept example's position maps to its index in the input, as ``(table, ranks)``
    (both None: nothing was dropped). From the dropped ones when they are fewer (position
    ``p`` is index ``p + #{j: dropped[j] - j <= p}``: ``ranks``), else a table."""
    if dropped is None:
        return None, None
    if len(dropped) <= n_kept:
        return None, dropped - np.arange(len(dropped))
    mask = np.ones(n_in, dtype=bool)
    mask[dropped] = False
    return np.flatnonzero(mask).astype(_index_dtype(n_in)), None


def _compact(ls: np.ndarray, lt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lengths in the smallest type that holds them: they are the batcher's memory."""
    top = max(int(ls.max()), int(lt.max()))
    small = next((t for t in (np.uint8, np.uint16) if top <= np.iinfo(t).max), np.int32)
    return ls.astype(small, copy=False), lt.astype(small, copy=False)


def _index_dtype(n: int) -> type:
    return np.int32 if n < np.iinfo(np.int32).max else np.int64


def _sorted_by_length(
    ls: np.ndarray, lt: np.ndarray, rng: np.random.Generator | None
) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``0 .. n-1`` sorted by ``(max(ls, lt), ls)``; ties in a random order drawn
    from ``rng`` (the same as ``rng.permutation(n)`` then a stable sort), or in input order.
    Returns the order and the sorted ``max(ls, lt)`` (in ``ls``'s type).

    A stable counting sort done a chunk at a time: no array of ``n`` int64 beyond the result's
    own type, so millions of examples sort in a few tens of megabytes.
    """
    n = len(ls)
    dtype = _index_dtype(n)
    if rng is not None:
        perm = np.arange(n, dtype=dtype)
        rng.shuffle(perm)  # the very draws of rng.permutation(n), in a smaller type
    else:
        perm = None
    width = int(ls.max()) + 1
    n_keys = (int(max(ls.max(), lt.max())) + 1) * width

    def keys(a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        idx = perm[a:b] if perm is not None else np.arange(a, b, dtype=dtype)
        s, t = ls[idx].astype(np.int64), lt[idx].astype(np.int64)
        return idx, np.maximum(s, t) * width + s

    step = 1 << 20
    counts = np.zeros(n_keys, dtype=np.int64)
    for a in range(0, n, step):
        counts += np.bincount(keys(a, min(n, a + step))[1], minlength=n_keys)
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])  # the first slot of every key
    order = np.empty(n, dtype=dtype)
    for a in range(0, n, step):
        idx, k = keys(a, min(n, a + step))
        within = np.argsort(k, kind="stable")
        k_sorted = k[within]
        first = np.searchsorted(k_sorted, k_sorted, side="left")  # rank among equal keys
        slots = start[k_sorted] + (np.arange(len(k_sorted)) - first)
        order[slots] = idx[within]
        start += np.bincount(k, minlength=n_keys)
    perm = None  # freed before the costs are laid out
    cost = np.repeat((np.arange(n_keys) // width).astype(ls.dtype), counts)
    return order, cost


def _cut(cost: np.ndarray, budget: int, cap: int) -> np.ndarray:
    """Greedy batch bounds over examples sorted by ``cost`` (non-decreasing): a batch takes
    the next example while ``size * cost <= budget`` and ``size <= cap``. Returns the
    ``n_batches + 1`` bounds (int64). Works run by run of equal cost, not example by example.
    """
    n = len(cost)
    runs = np.concatenate([np.flatnonzero(np.diff(cost)) + 1, [n]])
    pieces: list[np.ndarray] = []
    s = 0
    for end in runs.tolist():
        if s >= end:
            continue
        size = max(1, min(cap, budget // int(cost[s])))  # batches whose examples all cost this
        k = (end - s) // size
        if k:
            pieces.append(np.arange(s, s + k * size, size, dtype=np.int64))
            s += k * size
        if s < end:  # a batch that starts here and may take longer examples after this run
            pieces.append(np.array([s], dtype=np.int64))
            w = min(cap, n - s, budget // int(cost[s]))  # later examples cost as much or more
            sizes = np.arange(2, w + 1, dtype=np.int64)
            ok = sizes * cost[s + 1 : s + w] <= budget
            stop = np.flatnonzero(~ok)
            s += 1 + (int(stop[0]) if len(stop) else w - 1)
    pieces.append(np.array([n], dtype=np.int64))
    return np.concatenate(pieces)
