"""Both model kinds learn a small task, and greedy and beam search decode what they learned.

A causal leak in training (the decoder seeing the token it must predict) would make the loss fall
while decoding fails; this catches it.  Slow (seconds of training): ``-m "not slow"`` skips it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.decoding import generate
from qkv.nn.seq2seq import build_model

PAD, BOS, EOS, V = 0, 1, 2, 12


def reverse_task(n: int, g: torch.Generator, max_len: int = 6):
    """Random words 3..V-1 of length 1..max_len; the target is the source reversed."""
    lens = torch.randint(1, max_len + 1, (n,), generator=g)
    src = torch.randint(3, V, (n, max_len), generator=g)
    src[torch.arange(max_len)[None, :] >= lens[:, None]] = PAD
    tgt = torch.full((n, max_len + 2), PAD)
    tgt[:, 0] = BOS
    for i in range(n):
        L = int(lens[i])
        tgt[i, 1 : L + 1] = src[i, :L].flip(0)
        tgt[i, L + 1] = EOS
    return src, lens, tgt


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["transformer", "bahdanau"])
def test_learns_to_reverse_and_decodes_it(kind):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    # the smallest sizes and fewest updates that learn it on seeds 0, 1 and 2 (32 of 32 right)
    width, updates = (32, 400) if kind == "transformer" else (64, 120)
    model = build_model(
        dict(
            src_vocab_size=V,
            tgt_vocab_size=V,
            kind=kind,
            num_hiddens=width,
            ffn_num_hiddens=2 * width,
            num_heads=4,
            embed_size=32,
            num_enc_layers=2,
            num_dec_layers=2,
            dropout=0.0,
        )
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(updates):
        src, lens, tgt = reverse_task(64, g)
        logits = model(src, tgt[:, :-1], lens)
        loss = F.cross_entropy(logits.transpose(1, 2), tgt[:, 1:], ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
    src, lens, tgt = reverse_task(32, torch.Generator().manual_seed(1))
    want = [src[i, : int(lens[i])].flip(0).tolist() for i in range(32)]
    args = dict(max_output_len=8, bos_id=BOS, eos_id=EOS)
    greedy = generate(model, src, lens, **args)
    beam = generate(model, src, lens, beam_size=4, **args)
    # a model that learned nothing, or trained with a causal leak, gets about none right
    assert sum(g == w for g, w in zip(greedy, want)) >= 24, (loss.item(), greedy[:4], want[:4])
    assert sum(b == w for b, w in zip(beam, want)) >= 24
    assert model.training  # generate restored the mode
