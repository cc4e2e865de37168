"""Small models and batches shared by the model and decoding tests."""

from __future__ import annotations

import torch

from qkv.decoding import greedy_search
from qkv.nn.seq2seq import EncoderDecoder, build_model

V = 23  # vocabulary: 0 pad, 1 bos, 2 eos, 3.. words
PAD, BOS, EOS = 0, 1, 2
MAX_LEN = 12


def tiny(kind: str = "transformer", dtype: torch.dtype = torch.float32, **kw) -> EncoderDecoder:
    """A small random model in eval mode."""
    cfg = dict(
        src_vocab_size=V,
        tgt_vocab_size=V,
        kind=kind,
        num_hiddens=32,
        ffn_num_hiddens=48,
        num_heads=4,
        embed_size=16,
        num_enc_layers=2,
        num_dec_layers=2,
        dropout=0.1,
    )
    cfg.update(kw)
    return build_model(cfg).to(dtype).eval()


def batch(B: int = 6, L: int = 9, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded source ids ``(B, L)`` with lengths from 1 to L (the longest is L)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, L + 1, (B,), generator=g)
    lens[0] = L
    src = torch.randint(3, V, (B, L), generator=g)
    src[torch.arange(L)[None, :] >= lens[:, None]] = PAD
    return src, lens


def calibrate_eos(model: EncoderDecoder, src: torch.Tensor, lens: torch.Tensor) -> float:
    """Raise the EOS logit of a random model until its greedy outputs have varied lengths.

    A random model rarely says EOS, or says it at once; a bias on the output projection picked
    here makes sentences stop at different steps, some not at all, so stopping is exercised.
    """
    bias = model.decoder.dense.bias
    best, best_bias = -1, 0.0
    with torch.no_grad():
        base = bias[EOS].item()
        for b in [x / 4 for x in range(0, 17)]:
            bias[EOS] = base + b
            out = greedy_search(model, src, lens, max_output_len=MAX_LEN, bos_id=BOS, eos_id=EOS)
            n = len({len(o) for o in out})
            if n > best:
                best, best_bias = n, b
        bias[EOS] = base + best_bias
    return best_bias
