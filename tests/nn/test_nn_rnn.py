"""The book's GRU encoder and Bahdanau attention decoder, batch-first."""

from __future__ import annotations

import pytest
import torch

from qkv.nn import AdditiveAttention
from qkv.nn.rnn import RNNDecoderState, Seq2SeqAttentionDecoder, Seq2SeqEncoder


def test_book_shapes():
    """d2l 1.0's example sizes, batch-first: (B, L, H) outputs, (layers, B, H) state."""
    encoder = Seq2SeqEncoder(vocab_size=10, embed_size=8, num_hiddens=16, num_layers=2)
    encoder.eval()
    decoder = Seq2SeqAttentionDecoder(vocab_size=10, embed_size=8, num_hiddens=16, num_layers=2)
    decoder.eval()
    X = torch.zeros((4, 7), dtype=torch.long)
    outputs, hidden = encoder(X)
    assert outputs.shape == (4, 7, 16) and hidden.shape == (2, 4, 16)
    state = decoder.init_state(encoder(X), None)
    logits, state = decoder(X, state)
    assert logits.shape == (4, 7, 10)
    assert isinstance(state, RNNDecoderState) and state.hidden.shape == (2, 4, 16)
    assert isinstance(decoder.attention, AdditiveAttention)


def book_decoder_forward(dec: Seq2SeqAttentionDecoder, X, enc_outputs, hidden, vl):
    """The book's loop, written out: query the last layer's state, concatenate, step the GRU."""
    outs = []
    for x in dec.embedding(X).permute(1, 0, 2):  # (B, E) per step
        q = hidden[-1].unsqueeze(1)
        ctx = dec.attention(q, enc_outputs, enc_outputs, vl)
        inp = torch.cat((ctx, x.unsqueeze(1)), dim=-1)
        out, hidden = dec.rnn(inp, hidden)
        outs.append(out)
    return dec.dense(torch.cat(outs, 1)), hidden


def test_decoder_matches_the_book_and_is_incremental():
    enc = Seq2SeqEncoder(20, 8, 16, 2).eval()
    dec = Seq2SeqAttentionDecoder(20, 8, 16, 2).eval()
    src, vl = torch.randint(0, 20, (3, 6)), torch.tensor([6, 2, 4])
    tgt = torch.randint(0, 20, (3, 5))
    outputs, hidden = enc(src, vl)
    state = dec.init_state((outputs, hidden), vl)
    logits, new = dec(tgt, state)
    ref, ref_hidden = book_decoder_forward(dec, tgt, outputs, hidden, vl)
    torch.testing.assert_close(logits, ref)
    torch.testing.assert_close(new.hidden, ref_hidden)
    assert state.hidden is hidden  # the input state is left as it was
    steps, s = [], state
    for t in range(5):
        out, s = dec(tgt[:, t : t + 1], s)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), logits)


def test_encoder_skips_padding():
    """A sentence's outputs and final state do not depend on how much it is padded."""
    enc = Seq2SeqEncoder(20, 8, 16, 2).eval()
    src = torch.randint(1, 20, (1, 4))
    padded = torch.cat([src, torch.zeros(1, 5, dtype=torch.long)], 1)
    o1, h1 = enc(src, torch.tensor([4]))
    o2, h2 = enc(padded, torch.tensor([4]))
    torch.testing.assert_close(o2[:, :4], o1)
    torch.testing.assert_close(h2, h1)
    assert torch.all(o2[:, 4:] == 0)
    _, h3 = enc(src)  # no valid_lens: the whole row
    torch.testing.assert_close(h3, h1)


def test_attention_weights_per_step_on_request():
    enc = Seq2SeqEncoder(20, 8, 16, 1).eval()
    dec = Seq2SeqAttentionDecoder(20, 8, 16, 1).eval()
    src, vl = torch.randint(0, 20, (2, 6)), torch.tensor([6, 3])
    state = dec.init_state(enc(src, vl), vl)
    dec(torch.zeros(2, 4, dtype=torch.long), state)
    assert dec.attention_weights is None
    dec(torch.zeros(2, 4, dtype=torch.long), state, need_weights=True)
    w = dec.attention_weights
    assert w.shape == (2, 4, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4))
    assert torch.all(w[1, :, 3:] == 0)


def test_training_backward_and_tied_embeddings():
    enc = Seq2SeqEncoder(20, 16, 16, 2, dropout=0.2)
    dec = Seq2SeqAttentionDecoder(20, 16, 16, 2, dropout=0.2, tie_embeddings=True)
    assert dec.dense.weight is dec.embedding.weight
    src, vl = torch.randint(0, 20, (3, 6)), torch.tensor([6, 2, 4])
    logits, _ = dec(torch.randint(0, 20, (3, 5)), dec.init_state(enc(src, vl), vl))
    logits.logsumexp(-1).sum().backward()
    assert torch.isfinite(enc.embedding.weight.grad).all()


def test_reorder_state():
    dec = Seq2SeqAttentionDecoder(20, 8, 16, 2).eval()
    state = dec.init_state((torch.randn(2, 5, 16), torch.randn(2, 2, 16)), torch.tensor([5, 3]))
    idx = torch.tensor([1, 1, 0])
    new = dec.reorder_state(state, idx)
    torch.testing.assert_close(new.hidden, state.hidden[:, idx])
    torch.testing.assert_close(new.enc_outputs, state.enc_outputs[idx])
    assert new.enc_valid_lens.tolist() == [3, 3, 5]
    same = dec.reorder_state(state, torch.tensor([1, 0]), include_encoder=False)
    assert same.enc_outputs is state.enc_outputs


@pytest.mark.parametrize(
    ("make", "arg"),
    [
        (lambda: Seq2SeqEncoder(0, 8, 16, 2), "vocab_size"),
        (lambda: Seq2SeqEncoder(10, 8, 16, 0), "num_layers"),
        (lambda: Seq2SeqEncoder(10, 8, 16, 2, dropout=-0.1), "dropout"),
        (lambda: Seq2SeqAttentionDecoder(10, 8, 0, 2), "num_hiddens"),
        (lambda: Seq2SeqAttentionDecoder(10, 8, 16, 2, tie_embeddings=True), "tie_embeddings"),
    ],
)
def test_constructor_errors_name_the_argument(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()


def test_init_state_errors():
    dec = Seq2SeqAttentionDecoder(10, 8, 16, 2)
    with pytest.raises(ValueError, match="enc_outputs"):
        dec.init_state(torch.zeros(2, 5, 16), None)
    with pytest.raises(ValueError, match="num_layers"):
        dec.init_state((torch.zeros(2, 5, 16), torch.zeros(1, 2, 16)), None)
