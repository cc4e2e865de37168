"""Greedy and beam search over an :class:`~qkv.nn.seq2seq.EncoderDecoder` of either kind.

The encoder runs once per batch.  With ``use_cache=True`` (the default) each new token costs one
decoder step: the decoder takes only the last token and its state carries the self-attention keys
and values of every layer (the encoder's cross-attention keys and values are projected once); for
the Bahdanau model the state is the GRU's hidden state.  With ``use_cache=False`` every step
re-runs the decoder over the whole prefix (the book's way), which gives the same tokens, slower.

Batches are padded (``src_valid_lens``); every computation is per row, so a sentence's result does
not depend on its neighbours, their padding, or the batch size.  Greedy search drops finished
sentences from the batch (and from the decoder's cache) once a quarter of the batch is done, so
the rest decode on fewer rows; beam search does the same with finished sentences and all their
beams (until then a finished sentence's beams are dead, -inf).

The padding and begin-of-sequence tokens (``pad_id``, default 0, and ``bos_id``) are never
generated: their log-probabilities are set to -inf at every step, after the softmax, so the
scores stay the model's own log-probabilities (as Hugging Face's suppressed tokens).

Three options give ``transformers``' ``generate`` rules, for the models ``qkv import`` reads
(:class:`~qkv.decoding.Decoding`'s ``early_stopping``, ``forced_eos``, ``renormalize``; their
defaults are qkv's own rules): when a beam search ends a sentence, ``<eos>`` forced as the last
token a translation may have (scored 0), and the log-probabilities normalised again after the
suppressed tokens are removed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.seq2seq import EncoderDecoder
from .options import Decoding

__all__ = ["Hypothesis", "beam_search", "generate", "greedy_search", "search_hypotheses"]

#: (token ids without BOS/EOS, length-normalised score); greedy search scores nothing: NaN
Hypothesis = tuple[list[int], float]


# ---------------------------------------------------------------------------- checks
def _int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    return value


def _check_inputs(
    model: nn.Module, src: object, src_valid_lens: object
) -> tuple[Tensor, Tensor | None]:
    for attr in ("encode", "init_state", "decode", "reorder_state"):
        if not callable(getattr(model, attr, None)):
            raise TypeError(
                f"model: expected an EncoderDecoder (with encode, init_state, decode, "
                f"reorder_state), got {type(model).__name__} without {attr}"
            )
    if not isinstance(src, Tensor) or src.dim() != 2 or src.is_floating_point():
        got = f"{src.dtype} {tuple(src.shape)}" if isinstance(src, Tensor) else type(src).__name__
        raise ValueError(f"src: expected integer token ids of shape (B, Ls), got {got}")
    if src_valid_lens is None:
        return src, None
    if not isinstance(src_valid_lens, Tensor):
        src_valid_lens = torch.as_tensor(src_valid_lens, device=src.device)
    if src_valid_lens.shape != (src.shape[0],) or src_valid_lens.is_floating_point():
        raise ValueError(
            f"src_valid_lens: expected integer lengths of shape ({src.shape[0]},), got "
            f"{src_valid_lens.dtype} {tuple(src_valid_lens.shape)}"
        )
    return src, src_valid_lens.to(src.device)


#: the type of a decode length: one int for the batch, or one per sentence ``(B,)``
OutputLen = int | Sequence[int] | Tensor


def _limits(
    max_output_len: object, max_len: object, B: int, device: torch.device
) -> tuple[Tensor, int]:
    """``max_output_len`` (an int, or one int per sentence) as per-row limits ``(B,)`` and
    their maximum; ``max_len`` is its old keyword, accepted with a ``DeprecationWarning``
    (``max_len`` names a model's position table everywhere else in qkv)."""
    if max_len is not None:
        if max_output_len is not None:
            raise TypeError("max_len: the old name of max_output_len: give max_output_len alone")
        warnings.warn(
            "max_len= is the old name of the decode length: use max_output_len= (max_len is a "
            "model's position table)",
            DeprecationWarning,
            stacklevel=4,
        )
        max_output_len = max_len
    if max_output_len is None:
        raise TypeError("max_output_len: required: the most tokens to generate per sentence")
    n = max_output_len
    if isinstance(n, int) and not isinstance(n, bool):
        _int("max_output_len", n, 1)
        return torch.full((B,), n, dtype=torch.long, device=device), n
    if isinstance(n, Tensor):
        values = n.tolist() if n.dim() == 1 and not n.is_floating_point() else []
    elif isinstance(n, Sequence) and not isinstance(n, str):
        values = list(n)
    else:
        values = []
    ok = len(values) == B > 0 and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values
    )
    if not ok:
        raise ValueError(
            f"max_output_len: expected an int >= 1 or {B} ints >= 1 (one per sentence), got {n!r}"
        )
    return torch.tensor(values, dtype=torch.long, device=device), max(values)


class _EvalMode:
    """Evaluation mode (no dropout) and no autograd for the duration; restores the mode.

    A model whose every module is in evaluation mode already is left alone (``eval()`` and
    ``train()`` set an attribute on every module: a millisecond for a quantized model, at
    every batch)."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.training = model, model.training
        self.inference = torch.inference_mode()
        self.switch = any(m.training for m in model.modules())

    def __enter__(self) -> None:
        if self.switch:
            self.model.eval()
        self.inference.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.inference.__exit__(*exc)
        if self.switch:
            self.model.train(self.training)


def _banned(
    pad_id: int | None, bos_id: int, eos_id: int, suppress: Sequence[int] = ()
) -> list[int]:
    """The ids never generated: PAD, BOS and ``suppress`` (unless one is also the EOS id)."""
    if pad_id is not None:
        _int("pad_id", pad_id, 0)
    extra = [_int("suppress", i, 0) for i in suppress]
    return sorted({i for i in (pad_id, bos_id, *extra) if i is not None and i != eos_id})


class _Banned:
    """The ids never generated (:func:`_banned`), as a tensor made once per search."""

    def __init__(self, banned: list[int], device: torch.device) -> None:
        self.ids = banned
        self.index = torch.tensor(banned, dtype=torch.long, device=device) if banned else None


def _suppress(scores: Tensor, banned: _Banned) -> Tensor:
    """``scores`` ``(rows, V)`` with the ``banned`` columns set to -inf, in place (the search's
    own fresh logits or log-probabilities: no copy of a ``(rows, V)`` tensor per step)."""
    if banned.index is None:
        return scores
    V = scores.shape[-1]
    if banned.ids[-1] >= V:
        raise ValueError(
            f"pad_id/bos_id: expected ids below the model's vocabulary size {V}, got {banned.ids}"
        )
    return scores.index_fill_(1, banned.index, float("-inf"))


def _force_eos(scores: Tensor, last: Tensor, eos_id: int) -> Tensor:
    """``scores`` ``(rows, V)`` where the rows ``last`` ``(rows,)`` (bool) give every token
    -inf but ``<eos>``, which gets 0 (``transformers``' forced EOS: not its log-probability),
    in place; the others as they are."""
    if bool(last.any()):
        scores[last] = float("-inf")
        scores[last, eos_id] = 0.0
    return scores


_ARGMAX_BLOCK = 64


def _argmax(scores: Tensor) -> Tensor:
    """``scores.argmax(-1)`` of ``(rows, V)`` scores, exactly (the first maximum; a NaN counts as
    the maximum, as in ``torch.argmax``), faster on the CPU.

    ``torch.argmax`` over a row of a large vocabulary is several times slower than ``amax``:
    the maximum of each block of 64 columns is taken first (``amax``, vectorised), then the
    argmax of the first block holding the row's maximum (or its first NaN); the columns after the
    last whole block are compared on their own.
    """
    rows, V = scores.shape
    n = V // _ARGMAX_BLOCK
    if n < 2 or scores.stride(1) != 1 or scores.device.type != "cpu":
        return scores.argmax(dim=-1)
    end = n * _ARGMAX_BLOCK
    blocks = scores[:, :end].view(rows, n, _ARGMAX_BLOCK)
    best = blocks.amax(dim=-1).argmax(dim=-1)  # (rows,) the first block with the maximum / NaN
    inner = blocks[torch.arange(rows, device=scores.device), best].argmax(dim=-1)
    idx = best * _ARGMAX_BLOCK + inner
    if end < V:  # the last, partial block: taken only when strictly greater (or the first NaN)
        tail = scores[:, end:].argmax(dim=-1)
        tail_v = scores[:, end:].gather(1, tail.unsqueeze(1)).squeeze(1)
        main_v = scores.gather(1, idx.unsqueeze(1)).squeeze(1)
        take = (tail_v > main_v) | (tail_v.isnan() & ~main_v.isnan())
        idx = torch.where(take, tail + end, idx)
    return idx


def _block_repeats(scores: Tensor, tokens: Tensor, t: int, n: int) -> Tensor:
    """``scores`` ``(rows, V)`` with -inf for every token that would repeat an ``n``-gram the
    row already generated (``tokens[:, 1 : t + 1]``; fairseq's ``--no-repeat-ngram-size``).
    ``n=0`` blocks nothing. Returns a copy when something is blocked."""
    if n <= 0 or t < n:  # an n-gram to repeat needs n generated tokens
        return scores
    gen = tokens[:, 1 : t + 1]  # (rows, t)
    windows = gen.unfold(1, n, 1)  # (rows, t - n + 1, n): every n-gram so far
    tail = gen[:, t - n + 1 :]  # (rows, n - 1): the n - 1 tokens the next one follows
    match = (windows[:, :, :-1] == tail.unsqueeze(1)).all(-1)  # (rows, t - n + 1)
    rows, where = match.nonzero(as_tuple=True)
    if rows.numel() == 0:
        return scores
    scores = scores.clone()
    scores[rows, windows[rows, where, -1]] = float("-inf")
    return scores


def _top_candidates(scores: Tensor, logp: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """``(scores.unsqueeze(-1) + logp).view(B, K * V).topk(n)`` (values best first, flat
    indices ``k * V + v``) without adding and sorting all ``K * V`` candidates.

    Shapes: scores ``(B, K)``, logp ``(B, K, V)``.  Each beam's log-probabilities are cut into
    blocks of 64 columns; a block's best candidate is ``scores + amax(block)`` (the same float
    sum, rounding being monotone), so the ``n`` best candidates lie in the ``n`` blocks with the
    best maxima: only those (and the columns after the last whole block) are added and ranked.
    The values are the same floats as the full sum's; only the order of exactly equal values
    may differ, as ``topk`` leaves it unspecified.
    """
    B, K, V = logp.shape
    nb = V // _ARGMAX_BLOCK
    if nb * K < 2 * n or logp.stride(2) != 1 or logp.device.type != "cpu":
        return (scores.unsqueeze(-1) + logp).view(B, K * V).topk(n, dim=1)
    end = nb * _ARGMAX_BLOCK
    blocks = logp[..., :end].view(B, K, nb, _ARGMAX_BLOCK)
    best = (blocks.amax(dim=-1) + scores.unsqueeze(-1)).view(B, K * nb)  # (B, K*nb)
    sel = best.topk(n, dim=1).indices  # (B, n) blocks k * nb + j
    rows = torch.arange(B, device=logp.device).unsqueeze(1)
    picked = blocks.reshape(B, K * nb, _ARGMAX_BLOCK)[rows, sel]  # (B, n, 64)
    k_sel = torch.div(sel, nb, rounding_mode="floor")
    cand = (scores.gather(1, k_sel).unsqueeze(-1) + picked).view(B, n * _ARGMAX_BLOCK)
    # flat indices k * V + j * 64 + c of every picked candidate
    start = k_sel * V + (sel - k_sel * nb) * _ARGMAX_BLOCK  # (B, n)
    cols = torch.arange(_ARGMAX_BLOCK, device=logp.device)
    flat = (start.unsqueeze(-1) + cols).view(B, n * _ARGMAX_BLOCK)
    if end < V:  # every beam's last, partial block: all of its candidates
        tail = (scores.unsqueeze(-1) + logp[..., end:]).view(B, K * (V - end))
        tail_idx = torch.arange(K, device=logp.device).unsqueeze(1) * V
        tail_idx = (tail_idx + torch.arange(end, V, device=logp.device)).view(1, -1).expand(B, -1)
        cand, flat = torch.cat([cand, tail], dim=1), torch.cat([flat, tail_idx], dim=1)
    top_v, where = cand.topk(n, dim=1)
    return top_v, flat.gather(1, where)


def _encode(model: nn.Module, src: Tensor, vl: Tensor | None) -> Any:
    """The encoder's outputs; an :class:`~qkv.nn.seq2seq.EncoderDecoder` may skip the padding
    (only the valid positions are ever read)."""
    if isinstance(model, EncoderDecoder):
        return model.encode(src, vl, skip_padding=True)
    return model.encode(src, vl)


def _step(model, tokens: Tensor, t: int, state, state0, use_cache: bool):
    """Logits ``(rows, V)`` of the next token after ``tokens[:, :t + 1]``, and the new state."""
    if use_cache:
        logits, state = model.decode(tokens[:, t : t + 1], state)
    else:  # the book's way: the whole prefix again, from the initial state
        logits, _ = model.decode(tokens[:, : t + 1], state0)
    return logits[:, -1], state


# ---------------------------------------------------------------------------- greedy
def greedy_search(
    model: nn.Module,
    src: Tensor,
    src_valid_lens: Tensor | Sequence[int] | None = None,
    *,
    max_output_len: OutputLen | None = None,
    bos_id: int,
    eos_id: int,
    pad_id: int | None = 0,
    use_cache: bool = True,
    no_repeat_ngram: int = 0,
    suppress: Sequence[int] = (),
    forced_eos: bool = False,
    max_len: OutputLen | None = None,
) -> list[list[int]]:
    """The most likely next token at every step, for each sentence of the batch.

    Shapes: src ``(B, Ls)`` token ids, src_valid_lens ``(B,)`` or None, max_output_len an int
    or ``(B,)`` (each sentence's own limit).  Returns, per sentence, at most its
    ``max_output_len`` token
    ids, without BOS and EOS (with ``forced_eos``, the last token allowed is EOS: at most
    ``max_output_len - 1``).  ``pad_id`` (None: none) and ``bos_id`` are never chosen, nor
    (``no_repeat_ngram=n > 0``) a token that would repeat an n-gram.
    """
    src, vl = _check_inputs(model, src, src_valid_lens)
    limits, T = _limits(max_output_len, max_len, src.shape[0], src.device)
    _int("bos_id", bos_id, 0)
    _int("eos_id", eos_id, 0)
    banned = _Banned(_banned(pad_id, bos_id, eos_id, suppress), src.device)
    B = src.shape[0]
    with _EvalMode(model):
        state0 = model.init_state(_encode(model, src, vl), vl, use_cache=use_cache, capacity=T)
        state = state0
        # EOS after every row's last token: a row dropped from the batch reads as ended there
        tokens = torch.full((B, T + 1), eos_id, dtype=torch.long, device=src.device)
        tokens[:, 0] = bos_id
        alive = torch.arange(B, device=src.device)  # the batch's rows still decoded
        rows, lim = tokens, limits  # the alive rows' tokens and limits
        finished = torch.zeros(B, dtype=torch.bool, device=src.device)
        steps = T
        for t in range(T):
            logits, state = _step(model, rows, t, state, state0, use_cache)
            logits = _block_repeats(_suppress(logits, banned), rows, t, no_repeat_ngram)
            nxt = _argmax(logits).masked_fill(finished, eos_id)
            if forced_eos:
                nxt = nxt.masked_fill(lim == t + 1, eos_id)
            rows[:, t + 1] = nxt
            finished |= (nxt == eos_id) | (lim <= t + 1)  # EOS, or the row's own limit
            n_done = int(finished.sum())
            if n_done == len(finished):
                steps = t + 1
                break
            # early exit: finished rows leave the batch (its cache and encoder memory) once a
            # quarter of it is done, so the rest decode on fewer rows; the cache copy is paid
            # a few times per batch, not every step
            if use_cache and 4 * n_done >= len(finished):
                if rows is not tokens:
                    tokens[alive] = rows
                keep = (~finished).nonzero().squeeze(1)
                state = model.reorder_state(state, keep)
                alive, lim = alive[keep], lim[keep]
                rows, finished = tokens[alive], finished[keep]
        if rows is not tokens:
            tokens[alive] = rows
    out = []
    for row in tokens[:, 1 : steps + 1].tolist():
        out.append(row[: row.index(eos_id)] if eos_id in row else row)
    return out


# ---------------------------------------------------------------------------- beam search
def _penalised(score: float, length: int, alpha: float) -> float:
    """``score / length ** alpha`` (fairseq's and Hugging Face's length normalisation)."""
    return score / (max(length, 1) ** alpha)


def beam_search(
    model: nn.Module,
    src: Tensor,
    src_valid_lens: Tensor | Sequence[int] | None = None,
    *,
    max_output_len: OutputLen | None = None,
    bos_id: int,
    eos_id: int,
    pad_id: int | None = 0,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    n_best: int = 1,
    use_cache: bool = True,
    no_repeat_ngram: int = 0,
    suppress: Sequence[int] = (),
    early_stopping: bool | str = True,
    forced_eos: bool = False,
    renormalize: bool = False,
    max_len: OutputLen | None = None,
) -> list[list[Hypothesis]]:
    """Beam search, batched over sentences.

    Each sentence keeps ``beam_size`` live hypotheses.  At every step the ``2 * beam_size`` best
    extensions are ranked; those ending in EOS among the first ``beam_size`` are finished with the
    score ``sum(log p) / length ** length_penalty`` (``length`` counts the EOS), and the best
    ``beam_size`` others live on.  A sentence is done when it has ``beam_size`` finished
    hypotheses (fairseq's rule, ``early_stopping=True``; False and ``"never"`` are
    ``transformers``' rules, see :class:`~qkv.decoding.Decoding`); at its ``max_output_len``
    (an int, or one per sentence ``(B,)``) its live hypotheses are finished as they are, or,
    with ``forced_eos``, its last token is EOS, scored 0.  ``renormalize`` normalises the
    log-probabilities again once the tokens never generated are removed.

    ``pad_id`` (None: none) and ``bos_id`` are never generated: their log-probabilities are -inf
    after the softmax, so scores remain the model's log-probabilities; with
    ``no_repeat_ngram=n > 0`` neither is a token that would repeat an n-gram of its hypothesis.

    Shapes: src ``(B, Ls)``, src_valid_lens ``(B,)`` or None.  Returns per sentence its ``n_best``
    hypotheses ``(token ids without BOS/EOS, score)``, best first.
    """
    src, vl = _check_inputs(model, src, src_valid_lens)
    limits, T = _limits(max_output_len, max_len, src.shape[0], src.device)
    _int("bos_id", bos_id, 0)
    _int("eos_id", eos_id, 0)
    banned = _Banned(_banned(pad_id, bos_id, eos_id, suppress), src.device)
    # the options checked as every decoding is: one value, one set of rules
    options = Decoding(
        beam_size=beam_size,
        length_penalty=length_penalty,
        n_best=n_best,
        early_stopping=early_stopping,
        forced_eos=forced_eos,
        renormalize=renormalize,
    )
    K, alpha = options.beam_size, options.length_penalty
    B, dev = src.shape[0], src.device
    finished = _Finished(B, K, alpha, options.early_stopping)
    with _EvalMode(model):
        state = model.init_state(_encode(model, src, vl), vl, use_cache=use_cache, capacity=T)
        # every sentence's row repeated K times: rows b*K .. b*K+K-1 are its beams; with a
        # cache the first step runs on one row per sentence (its K beams are the same then:
        # one live beam, the others -inf) and the rows are repeated after it
        repeat = torch.arange(B, device=dev).repeat_interleave(K)
        narrow = use_cache and K > 1
        if not narrow:
            state = model.reorder_state(state, repeat)
        state0 = state
        tokens = torch.full((B * K, T + 1), bos_id, dtype=torch.long, device=dev)
        scores = torch.full((B, K), float("-inf"), device=dev)
        scores[:, 0] = 0.0  # one live beam at first, so the K beams differ
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        base = torch.arange(B, device=dev).unsqueeze(1) * K  # (B, 1)
        ids = list(range(B))  # the sentences still in the batch, by their index in src
        for t in range(T):
            rows_now = tokens[::K] if narrow and t == 0 else tokens
            logits, state = _step(model, rows_now, t, state, state0, use_cache)
            logp = _suppress(F.log_softmax(logits.float(), dim=-1), banned)  # (B*K, V)
            if rows_now is not tokens:  # one row per sentence: its log-probabilities K times
                state, logp = _expand_first_step(model, state, logp, K, repeat)
            logp = _block_repeats(logp, tokens, t, no_repeat_ngram)
            if renormalize:
                logp = logp.log_softmax(dim=-1)
            if forced_eos:
                logp = _force_eos(logp, (limits == t + 1).repeat_interleave(K), eos_id)
            V = logp.shape[-1]
            Bt = len(ids)  # sentences still in the batch
            # the 2K best of scores + logp over (K, V), best first
            top_v, top_i = _top_candidates(scores, logp.view(Bt, K, V), min(2 * K, K * V))
            top_beam, top_tok = top_i // V, top_i % V
            is_eos = top_tok == eos_id
            # EOS among the K best: a finished hypothesis
            fin = is_eos[:, :K] & torch.isfinite(top_v[:, :K]) & ~done.unsqueeze(1)
            if bool(fin.any()):
                finished.ending_in_eos(fin, top_v, top_beam, tokens, t, ids, done)
            # the K best extensions that are not EOS live on
            live_v, live_j = top_v.masked_fill(is_eos, float("-inf")).topk(K, dim=1)
            if options.early_stopping is not True:  # transformers' rule: can they do better?
                finished.settled(live_v[:, 0], t, limits, ids, done)
            scores = live_v.masked_fill(done.unsqueeze(1), float("-inf"))
            if bool(done.all()):
                break
            rows = (base + top_beam.gather(1, live_j)).view(-1)  # (B*K,)
            tokens = tokens.index_select(0, rows)
            tokens[:, t + 1] = top_tok.gather(1, live_j).view(-1)
            if use_cache:  # within a sentence: the encoder's part stays as it is
                state = model.reorder_state(state, rows, include_encoder=False)
            ending = (limits == t + 1) & ~done  # at max_output_len: the live ones end
            if bool(ending.any()):
                scores = finished.at_limit(ending, scores, tokens, t, ids, done)
                if bool(done.all()):
                    break
            n_done = int(done.sum())
            if use_cache and n_done and 4 * n_done >= len(ids):  # a quarter done: they leave
                state, tokens, scores, limits, done, ids = _leave_batch(
                    model, state, K, tokens, scores, limits, done, ids
                )
                base = torch.arange(len(ids), device=dev).unsqueeze(1) * K
    return finished.best_first(n_best)


def _leave_batch(
    model: nn.Module,
    state: Any,
    K: int,
    tokens: Tensor,
    scores: Tensor,
    limits: Tensor,
    done: Tensor,
    ids: list[int],
) -> tuple[Any, Tensor, Tensor, Tensor, Tensor, list[int]]:
    """The early exit: the finished sentences leave the batch with their ``K`` beams (cache,
    encoder memory); every computation is per row, so the others' results do not change.
    Shapes: tokens ``(B*K, T+1)``, scores ``(B, K)``, limits and done ``(B,)``; returned for
    the ``B'`` sentences left, with their ``ids`` (indices in the source batch)."""
    keep = (~done).nonzero().squeeze(1)  # (B',) sentences of the batch
    keep_rows = (keep.unsqueeze(1) * K + torch.arange(K, device=done.device)).view(-1)
    state = model.reorder_state(state, keep_rows)
    kept = [ids[i] for i in keep.tolist()]
    return state, tokens[keep_rows], scores[keep], limits[keep], done[keep], kept


def _expand_first_step(
    model: nn.Module, state: Any, logp: Tensor, K: int, repeat: Tensor
) -> tuple[Any, Tensor]:
    """After the first step on one row per sentence: the state and the log-probabilities
    ``(B, V)`` of every sentence for its ``K`` beams (``(B*K, V)``, rows ``repeat``)."""
    expand = getattr(model, "expand_beams", None)  # e.g. beams that reorder without copying
    state = model.reorder_state(state, repeat) if expand is None else expand(state, K)
    return state, logp.index_select(0, repeat)


class _Finished:
    """Every sentence's finished hypotheses while searching, as ``(length-normalised score,
    order finished, token ids)``; the beam ``K``, the length penalty ``alpha`` they are scored
    with, and when a sentence is done (``early``: :attr:`~qkv.decoding.Decoding.
    early_stopping`)."""

    def __init__(self, B: int, K: int, alpha: float, early: bool | str = True) -> None:
        self.hyps: list[list[tuple[float, int, list[int]]]] = [[] for _ in range(B)]
        self.K, self.alpha, self.early = K, alpha, early

    def settled(self, best: Tensor, t: int, limits: Tensor, ids: list[int], done: Tensor) -> None:
        """``transformers``' end of a sentence (``early_stopping`` False or ``"never"``): a
        sentence with ``K`` finished hypotheses is ``done`` (set in place) when its best live
        one (``best`` ``(Bt,)``: the sum of its ``t + 1`` log-probabilities), scored at its
        length (with ``"never"`` and ``alpha > 0``: at the sentence's limit), is no better than
        the worst of its ``K`` best finished ones."""
        for b in (~done).nonzero().flatten().tolist():
            hyps = self.hyps[ids[b]]
            if len(hyps) < self.K:
                continue
            worst = sorted((h[0] for h in hyps), reverse=True)[self.K - 1]
            length = int(limits[b]) if self.early == "never" and self.alpha > 0 else t + 1
            if _penalised(float(best[b]), length, self.alpha) <= worst:
                done[b] = True

    def ending_in_eos(
        self,
        fin: Tensor,
        top_v: Tensor,
        top_beam: Tensor,
        tokens: Tensor,
        t: int,
        ids: list[int],
        done: Tensor,
    ) -> None:
        """The hypotheses ending in EOS at step ``t`` (``fin`` ``(Bt, K)``, True at candidate
        ``j`` of sentence ``b``; ``ids``: the batch's sentences by their index in the
        source), kept; a sentence with ``K`` of them is ``done`` (set in place)."""
        K = fin.shape[1]
        for b, j in fin.nonzero().tolist():
            row = b * K + int(top_beam[b, j])
            score = _penalised(float(top_v[b, j]), t + 1, self.alpha)
            hyps = self.hyps[ids[b]]
            hyps.append((score, len(hyps), tokens[row, 1 : t + 1].tolist()))
            if len(hyps) >= self.K and self.early is True:
                done[b] = True

    def at_limit(
        self,
        ending: Tensor,
        scores: Tensor,
        tokens: Tensor,
        t: int,
        ids: list[int],
        done: Tensor,
    ) -> Tensor:
        """The live hypotheses of the sentences at their ``max_output_len`` after step ``t``
        (``ending`` ``(Bt,)``), kept as they are; those sentences are ``done`` (set in place)
        and their ``scores`` ``(Bt, K)`` -inf (returned)."""
        K = scores.shape[1]
        for b in ending.nonzero().flatten().tolist():
            hyps = self.hyps[ids[b]]
            for k in range(K):
                s = float(scores[b, k])
                if math.isfinite(s):
                    out = tokens[b * K + k, 1 : t + 2].tolist()
                    hyps.append((_penalised(s, t + 1, self.alpha), len(hyps), out))
            done[b] = True
        return scores.masked_fill(done.unsqueeze(1), float("-inf"))

    def best_first(self, n_best: int) -> list[list[Hypothesis]]:
        """Each sentence's ``n_best`` hypotheses, best first (ties: the first finished first)."""
        out = []
        for hyps in self.hyps:
            hyps.sort(key=lambda h: (-h[0], h[1]))  # best first; ties: first finished first
            out.append([(ids, score) for score, _, ids in hyps[:n_best]])
        return out


# ---------------------------------------------------------------------------- entry points
def search_hypotheses(
    model: nn.Module,
    src: Tensor,
    src_valid_lens: Tensor | Sequence[int] | None = None,
    *,
    max_output_len: OutputLen | None = None,
    bos_id: int,
    eos_id: int,
    decoding: Decoding,
    pad_id: int | None = 0,
    use_cache: bool = True,
    suppress: Sequence[int] = (),
    max_len: OutputLen | None = None,
) -> list[list[Hypothesis]]:
    """Translate a batch as ``decoding`` says, every sentence's hypotheses best first.

    Greedy search (:attr:`Decoding.greedy`) gives one hypothesis per sentence, scored NaN (it
    ranks no alternatives); beam search gives ``decoding.n_best`` of them, each scored
    ``sum(log p) / length ** length_penalty``. The arguments are :func:`generate`'s; the
    decode length is ``max_output_len`` (``decoding``'s own length rule is the caller's:
    :meth:`Decoding.output_limit`).

    Shapes: src ``(B, Ls)``, src_valid_lens ``(B,)`` or None, max_output_len an int or
    ``(B,)``.
    """
    if not isinstance(decoding, Decoding):
        raise TypeError(f"decoding: expected a qkv Decoding, got {type(decoding).__name__}")
    if not isinstance(use_cache, bool):
        raise TypeError(f"use_cache: expected a bool, got {use_cache!r}")
    limits, _ = _limits(max_output_len, max_len, src.shape[0], src.device)
    common: dict[str, Any] = dict(
        max_output_len=limits,
        bos_id=bos_id,
        eos_id=eos_id,
        pad_id=pad_id,
        no_repeat_ngram=decoding.no_repeat_ngram,
        suppress=(*suppress, *decoding.suppress),
        forced_eos=decoding.forced_eos,
        use_cache=use_cache,
    )
    if decoding.greedy:
        return [[(ids, math.nan)] for ids in greedy_search(model, src, src_valid_lens, **common)]
    return beam_search(
        model,
        src,
        src_valid_lens,
        beam_size=decoding.beam_size,
        length_penalty=decoding.length_penalty,
        n_best=decoding.n_best,
        early_stopping=decoding.early_stopping,
        renormalize=decoding.renormalize,
        **common,
    )


def generate(
    model: nn.Module,
    src: Tensor,
    src_valid_lens: Tensor | Sequence[int] | None = None,
    *,
    max_output_len: OutputLen | None = None,
    bos_id: int,
    eos_id: int,
    pad_id: int | None = 0,
    beam_size: int = 1,
    length_penalty: float = 1.0,
    n_best: int = 1,
    use_cache: bool = True,
    no_repeat_ngram: int = 0,
    suppress: Sequence[int] = (),
    decoding: Decoding | None = None,
    early_stopping: bool | str = True,
    forced_eos: bool = False,
    renormalize: bool = False,
    max_len: OutputLen | None = None,
) -> list[list[int]] | list[list[Hypothesis]]:
    """Translate a batch: greedy (``beam_size=1``) or beam search.

    Args:
        model: an :class:`~qkv.nn.seq2seq.EncoderDecoder` (Transformer or Bahdanau); it runs in
            eval mode without autograd, and its mode is restored afterwards.
        src: ``(B, Ls)`` source token ids, right-padded.
        src_valid_lens: ``(B,)`` source lengths, or None when nothing is padded.
        max_output_len: the most tokens to generate per sentence (EOS included): one int for
            all, or one per sentence ``(B,)``, each row stopped at its own (so a sentence's
            result does not depend on its neighbours' limits either). Required.
        bos_id, eos_id: the target's begin- and end-of-sequence ids.
        pad_id: the target's padding id (qkv's vocabularies use 0), or None.  Neither it nor
            ``bos_id`` is ever generated: both are masked to -inf at every step.
        beam_size: 1 for greedy search.
        length_penalty: ``alpha`` of the beam score ``sum(log p) / length ** alpha``.
        n_best: hypotheses to return per sentence (at most ``beam_size``).
        use_cache: incremental decoding (one step per token); False re-runs the whole prefix.
        no_repeat_ngram: n > 0: never generate a token that would repeat an n-gram the sentence
            (the hypothesis) already holds (fairseq's ``--no-repeat-ngram-size``, Hugging
            Face's ``no_repeat_ngram_size``); a guard against loops of an undertrained model.
        suppress: more ids never generated, like ``pad_id`` (e.g. ``<unk>`` for a tokenizer
            with byte fallback, which never needs it).
        decoding: the search options as one :class:`Decoding` (then the keywords
            ``beam_size``, ``length_penalty``, ``n_best``, ``no_repeat_ngram``,
            ``early_stopping``, ``forced_eos`` and ``renormalize`` stay unset).
        early_stopping: when a beam search ends a sentence: True (qkv's rule: ``beam_size``
            finished), False or ``"never"`` (``transformers``' rules; see :class:`Decoding`).
        forced_eos: the last token a translation may have is EOS, scored 0 (``transformers``'
            ``forced_eos_token_id``).
        renormalize: log-probabilities normalised again after the suppressed tokens are
            removed (``transformers``' ``renormalize_logits``).
        max_len: the old name of ``max_output_len`` (a ``DeprecationWarning``).

    Returns:
        With ``n_best=1``, per sentence its best token ids without BOS and EOS (a list of lists);
        otherwise per sentence a list of ``n_best`` ``(token ids, score)`` pairs, best first.

    Raises:
        SettingError: (a ``ValueError``) a search option out of range, named by its keyword.
        TypeError: ``decoding`` given with search keywords too; no ``max_output_len``.
    """
    given = {"beam_size": beam_size, "length_penalty": length_penalty, "n_best": n_best}
    given |= {"no_repeat_ngram": no_repeat_ngram, "early_stopping": early_stopping}
    given |= {"forced_eos": forced_eos, "renormalize": renormalize}
    if decoding is None:
        decoding = Decoding(**given)
    else:
        default = Decoding()
        both = [k for k, v in given.items() if v != getattr(default, k)]
        if both:
            raise TypeError(
                "decoding: give the search options as one Decoding or as keywords, not both "
                f"(got decoding and {', '.join(both)})"
            )
    hyps = search_hypotheses(
        model,
        src,
        src_valid_lens,
        max_output_len=max_output_len,
        max_len=max_len,
        bos_id=bos_id,
        eos_id=eos_id,
        decoding=decoding,
        pad_id=pad_id,
        use_cache=use_cache,
        suppress=suppress,
    )
    if decoding.n_best == 1:  # the keyword API's shape: the best ids alone
        return [h[0][0] if h else [] for h in hyps]
    return hyps
