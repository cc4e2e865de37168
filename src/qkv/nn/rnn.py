"""The book's RNN encoder-decoder with Bahdanau attention (d2l 1.0 signatures, batch-first).

* :class:`Seq2SeqEncoder` ``(vocab_size, embed_size, num_hiddens, num_layers, dropout=0)``: an
  embedding and a multi-layer GRU.  ``forward(X (B, L), valid_lens=None)`` returns
  ``(outputs (B, L, num_hiddens), hidden (num_layers, B, num_hiddens))``.  Unlike the book, padding
  is skipped (packed sequences): ``hidden`` is each sentence's state at its own last token, so
  the result of a sentence never depends on how much its neighbours pad it.
* :class:`Seq2SeqAttentionDecoder` ``(vocab_size, embed_size, num_hiddens, num_layers,
  dropout=0)``: at every step, the last layer's hidden state queries the encoder's outputs with
  :class:`qkv.nn.AdditiveAttention`; the context and the embedded input token feed the GRU.

The decoder has the same interface as :class:`qkv.nn.transformer.TransformerDecoder`
(``init_state``, ``forward(X, state) -> (logits, state)``, ``reorder_state``), so training and
:func:`qkv.decoding.generate` run both models.  The GRU is incremental by nature: the "cache" of
decoding is the hidden state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ._checks import dropout_rate, token_ids
from ._checks import positive_int as _positive_int
from .attention import AdditiveAttention

__all__ = ["RNNDecoderState", "Seq2SeqAttentionDecoder", "Seq2SeqEncoder"]


def _init_gru_(module: nn.Module) -> None:
    """Xavier-uniform weights for Linear and GRU matrices (as d2l 1.0's ``init_seq2seq``)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
        elif isinstance(m, nn.GRU):
            for name, p in m.named_parameters():
                if name.startswith("weight"):
                    nn.init.xavier_uniform_(p)


class Seq2SeqEncoder(nn.Module):
    """The book's GRU encoder, ``Seq2SeqEncoder(vocab_size, embed_size, num_hiddens, num_layers,
    dropout=0)``, batch-first.

    ``forward(X (B, L) token ids, valid_lens (B,) or None)`` returns ``(outputs (B, L, D),
    hidden (num_layers, B, D))`` with ``D = num_hiddens``.  With ``valid_lens`` the GRU stops at
    each sentence's end: outputs past it are zero and ``hidden`` is taken at its last token.
    """

    def __init__(
        self,
        vocab_size: int,
        embed_size: int,
        num_hiddens: int,
        num_layers: int,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        _positive_int("vocab_size", vocab_size)
        _positive_int("embed_size", embed_size)
        self.num_hiddens = _positive_int("num_hiddens", num_hiddens)
        self.num_layers = _positive_int("num_layers", num_layers)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        dropout = dropout_rate(dropout)
        # GRU's dropout acts between layers only (torch warns when there is just one)
        self.rnn = nn.GRU(
            embed_size,
            num_hiddens,
            num_layers,
            dropout=dropout if num_layers > 1 else 0.0,
            batch_first=True,
        )
        _init_gru_(self)
        self.attention_weights = None  # no attention in this encoder

    def forward(
        self, X: Tensor, valid_lens: Tensor | None = None, *, need_weights: bool = False
    ) -> tuple[Tensor, Tensor]:
        embs = self.embedding(token_ids("X", X))  # (B, L, embed_size)
        if valid_lens is None:
            return self.rnn(embs)
        if not isinstance(valid_lens, Tensor):
            valid_lens = torch.as_tensor(valid_lens)
        if valid_lens.shape != (X.shape[0],):
            raise ValueError(
                f"valid_lens: expected shape ({X.shape[0]},), got {tuple(valid_lens.shape)}"
            )
        L = X.shape[1]
        # a sentence of length 0 still runs one step (over its padding), as without valid_lens
        lengths = valid_lens.detach().to("cpu", torch.long).clamp(1, L)
        packed = pack_padded_sequence(embs, lengths, batch_first=True, enforce_sorted=False)
        out, hidden = self.rnn(packed)
        outputs, _ = pad_packed_sequence(out, batch_first=True, total_length=L)
        return outputs, hidden


@dataclass
class RNNDecoderState:
    """What :class:`Seq2SeqAttentionDecoder` carries between calls.

    Attributes:
        enc_outputs: ``(B, Ls, D)`` the encoder's outputs (keys and values of the attention).
        hidden: ``(num_layers, B, D)`` the GRU's state (``D = num_hiddens``).
        enc_valid_lens: ``(B,)`` source lengths, or None.
        enc_keys: ``(B, Ls, D)`` the attention's projection of ``enc_outputs``, computed on the
            first decoding step and reused by every later one (None until then).
    """

    enc_outputs: Tensor
    hidden: Tensor
    enc_valid_lens: Tensor | None = None
    enc_keys: Tensor | None = None


class Seq2SeqAttentionDecoder(nn.Module):
    """The book's Bahdanau decoder, ``Seq2SeqAttentionDecoder(vocab_size, embed_size,
    num_hiddens, num_layers, dropout=0)``, batch-first.

    ``init_state((outputs, hidden), enc_valid_lens)`` takes the encoder's result;
    ``forward(X (B, Lt) token ids, state, *, need_weights=False)`` returns
    ``(logits (B, Lt, vocab_size), new_state)`` and leaves ``state`` untouched.  With
    ``need_weights=True``, ``self.attention_weights`` is ``(B, Lt, Ls)``: step ``t``'s additive
    attention over the source (the book keeps a list of per-step ``(B, 1, Ls)``).

    ``tie_embeddings=True`` (keyword) shares the embedding with the output projection; it needs
    ``embed_size == num_hiddens``.
    """

    def __init__(
        self,
        vocab_size: int,
        embed_size: int,
        num_hiddens: int,
        num_layers: int,
        dropout: float = 0.0,
        *,
        tie_embeddings: bool = False,
    ) -> None:
        super().__init__()
        _positive_int("vocab_size", vocab_size)
        _positive_int("embed_size", embed_size)
        self.num_hiddens = _positive_int("num_hiddens", num_hiddens)
        self.num_layers = _positive_int("num_layers", num_layers)
        dropout = dropout_rate(dropout)
        self.attention = AdditiveAttention(num_hiddens, num_hiddens, num_hiddens, dropout)
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.rnn = nn.GRU(
            embed_size + num_hiddens,
            num_hiddens,
            num_layers,
            dropout=dropout if num_layers > 1 else 0.0,
            batch_first=True,
        )
        self.dense = nn.Linear(num_hiddens, vocab_size)
        _init_gru_(self)
        if not isinstance(tie_embeddings, bool):
            raise TypeError(f"tie_embeddings: expected a bool, got {tie_embeddings!r}")
        if tie_embeddings:
            if embed_size != num_hiddens:
                raise ValueError(
                    f"tie_embeddings: expected embed_size == num_hiddens to share the weight, "
                    f"got embed_size={embed_size} and num_hiddens={num_hiddens}"
                )
            self.dense.weight = self.embedding.weight
        self.tie_embeddings = tie_embeddings
        self.attention_weights: Tensor | None = None

    def init_state(
        self,
        enc_outputs: tuple[Tensor, Tensor],
        enc_valid_lens: Tensor | None = None,
        *,
        use_cache: bool = False,
        capacity: int | None = None,
    ) -> RNNDecoderState:
        """The state from the encoder's ``(outputs (B, Ls, D), hidden (num_layers, B, D))``.

        ``use_cache`` and ``capacity`` are accepted for the common decoder interface: the GRU's
        hidden state is its own cache.
        """
        if not (isinstance(enc_outputs, (tuple, list)) and len(enc_outputs) == 2):
            raise ValueError(
                "enc_outputs: expected the encoder's (outputs (B, Ls, D), hidden "
                f"(num_layers, B, H)), got {type(enc_outputs).__name__}"
            )
        outputs, hidden = enc_outputs
        if outputs.dim() != 3 or outputs.shape[-1] != self.num_hiddens:
            raise ValueError(
                f"enc_outputs: expected outputs (B, Ls, {self.num_hiddens}), got "
                f"{tuple(outputs.shape)}"
            )
        if hidden.shape != (self.num_layers, outputs.shape[0], self.num_hiddens):
            raise ValueError(
                f"enc_outputs: expected hidden ({self.num_layers}, {outputs.shape[0]}, "
                f"{self.num_hiddens}) (encoder and decoder need the same num_layers), got "
                f"{tuple(hidden.shape)}"
            )
        if enc_valid_lens is not None and not isinstance(enc_valid_lens, Tensor):
            enc_valid_lens = torch.as_tensor(enc_valid_lens, device=outputs.device)
        return RNNDecoderState(outputs, hidden, enc_valid_lens)

    def forward(
        self, X: Tensor, state: RNNDecoderState, *, need_weights: bool = False
    ) -> tuple[Tensor, RNNDecoderState]:
        if not isinstance(state, RNNDecoderState):
            raise TypeError(
                f"state: expected an RNNDecoderState (from init_state), got {type(state).__name__}"
            )
        embs = self.embedding(token_ids("X", X))  # (B, Lt, embed_size)
        if embs.shape[1] == 0:
            raise ValueError("X: expected at least one target token, got shape (B, 0)")
        enc, vl, hidden = state.enc_outputs, state.enc_valid_lens, state.hidden
        keys = state.enc_keys
        if keys is None:  # the source is projected once, not at every step
            keys = self.attention.project_keys(enc)
        outputs, weights = [], []
        for t in range(embs.shape[1]):
            query = hidden[-1].unsqueeze(1)  # (B, 1, D): the last layer's state
            context = self.attention(
                query, enc, enc, vl, need_weights=need_weights, projected_keys=keys
            )  # (B, 1, D)
            x = torch.cat((context, embs[:, t : t + 1]), dim=-1)  # (B, 1, D + embed_size)
            out, hidden = self.rnn(x, hidden)  # (B, 1, D), (num_layers, B, D)
            outputs.append(out)
            if need_weights:
                weights.append(self.attention.attention_weights)  # (B, 1, Ls)
        self.attention_weights = torch.cat(weights, dim=1) if need_weights else None
        logits = self.dense(torch.cat(outputs, dim=1))  # (B, Lt, vocab_size)
        return logits, replace(state, hidden=hidden, enc_keys=keys)

    def reorder_state(
        self, state: RNNDecoderState, index: Tensor, *, include_encoder: bool = True
    ) -> RNNDecoderState:
        """Keep rows ``index`` ``(B',)`` of the state, in that order (beam search).

        With ``include_encoder=False`` the encoder's outputs are left as they are: valid when
        every row keeps the same source sentence.
        """
        state = replace(state, hidden=state.hidden.index_select(1, index))
        if include_encoder:
            state.enc_outputs = state.enc_outputs.index_select(0, index)
            if state.enc_keys is not None:
                state.enc_keys = state.enc_keys.index_select(0, index)
            if state.enc_valid_lens is not None:
                state.enc_valid_lens = state.enc_valid_lens.index_select(0, index)
        return state
