"""Seq2seq models on the CPU: KV-cached decoding, and training throughput against torch.

Issue 5's targets, side by side in one run:

* **decoding**: greedy decoding of 128 tokens, batch 32, num_hiddens 256, 4 heads, FFN 1024,
  3+3 layers; ``qkv.decoding.generate`` with its KV cache against the same search re-running the
  decoder over the whole prefix at every step (the book's way, ``use_cache=False``).  Target
  >= 5x.  The EOS logit is pushed down so that every sentence decodes all 128 tokens.
* **training**: one step (forward, cross-entropy, backward, AdamW) of the qkv Transformer
  (``build_model``) against ``torch.nn.Transformer`` with the same embeddings, sinusoidal positions
  and output projection: num_hiddens 256, 4 heads, 3+3 layers, FFN 1024, dropout 0.1, biases on
  both, 128 sentence pairs of 32 tokens (4096 target tokens) with padded sources.  Target >= 1.0x
  (the ratio of times is the ratio of tokens/s).

Run: ``python -m benchmarks.seq2seq [--quick] [--repeats N] [--json PATH] [--only decoding|training]``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from qkv.decoding import generate
from qkv.nn import PositionalEncoding
from qkv.nn.seq2seq import build_model

from .runner import Case, add_arguments, print_table, run_cases, write_json

BOS, EOS = 1, 2


def _config(vocab: int, D: int, heads: int, layers: int, ffn: int, dropout: float) -> dict:
    return dict(
        src_vocab_size=vocab,
        tgt_vocab_size=vocab,
        num_hiddens=D,
        ffn_num_hiddens=ffn,
        num_heads=heads,
        num_enc_layers=layers,
        num_dec_layers=layers,
        dropout=dropout,
    )


# ---------------------------------------------------------------------------- decoding
def decoding_case(
    B: int = 32, steps: int = 128, D: int = 256, layers: int = 3, src_len: int = 32
) -> Case:
    torch.manual_seed(0)
    vocab = 1000
    model = build_model(_config(vocab, D, 4, layers, 4 * D, 0.1)).eval()
    with torch.no_grad():
        model.decoder.dense.bias[EOS] = -1e4  # never stop early: every sentence decodes `steps`
    src = torch.randint(3, vocab, (B, src_len))
    lens = torch.randint(src_len // 2, src_len + 1, (B,))
    lens[0] = src_len

    def run(use_cache: bool) -> Callable[[], object]:
        def f() -> object:
            out = generate(
                model, src, lens, max_output_len=steps, bos_id=BOS, eos_id=EOS, use_cache=use_cache
            )
            assert all(len(x) == steps for x in out)
            return out

        return f

    return Case(
        f"greedy decoding {steps} tokens (B={B} D={D} {layers}+{layers} layers)",
        "re-run prefix",
        run(False),
        run(True),
        target=5.0,
        note=f"{B * steps} tokens per call",
    )


# ---------------------------------------------------------------------------- training
class TorchSeq2Seq(nn.Module):
    """``torch.nn.Transformer`` with the embeddings, positions and projection of qkv's model."""

    def __init__(self, vocab: int, D: int, heads: int, layers: int, ffn: int, dropout: float):
        super().__init__()
        self.D = D
        self.src_embedding = nn.Embedding(vocab, D)
        self.tgt_embedding = nn.Embedding(vocab, D)
        self.src_pos = PositionalEncoding(D, dropout)
        self.tgt_pos = PositionalEncoding(D, dropout)
        self.transformer = nn.Transformer(D, heads, layers, layers, ffn, dropout, batch_first=True)
        self.dense = nn.Linear(D, vocab)

    def forward(self, src, tgt, src_key_padding_mask, tgt_mask):
        s = self.src_pos(self.src_embedding(src) * math.sqrt(self.D))
        t = self.tgt_pos(self.tgt_embedding(tgt) * math.sqrt(self.D))
        out = self.transformer(
            s,
            t,
            tgt_mask=tgt_mask,
            src_key_padding_mask=src_key_padding_mask,
            memory_key_padding_mask=src_key_padding_mask,
            tgt_is_causal=True,
        )
        return self.dense(out)


def training_case(
    B: int = 128, L: int = 32, D: int = 256, heads: int = 4, layers: int = 3, ffn: int = 1024
) -> Case:
    torch.manual_seed(0)
    vocab, dropout = 1000, 0.1
    ours = build_model(_config(vocab, D, heads, layers, ffn, dropout) | dict(use_bias=True))
    peer = TorchSeq2Seq(vocab, D, heads, layers, ffn, dropout)
    ours.train(), peer.train()
    src = torch.randint(3, vocab, (B, L))
    lens = torch.randint(L // 2, L + 1, (B,))
    lens[0] = L
    kpm = torch.arange(L)[None, :] >= lens[:, None]  # True at padding
    tgt = torch.randint(3, vocab, (B, L + 1))
    dec_in, dec_out = tgt[:, :-1], tgt[:, 1:]
    causal = nn.Transformer.generate_square_subsequent_mask(L)

    def step(model: nn.Module, forward: Callable[[], torch.Tensor]) -> Callable[[], object]:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def f() -> object:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(forward().reshape(-1, vocab), dec_out.reshape(-1))
            loss.backward()
            opt.step()
            return loss

        return f

    n_ours = sum(p.numel() for p in ours.parameters())
    n_peer = sum(p.numel() for p in peer.parameters())
    return Case(
        f"training step (B={B} L={L} D={D} H={heads} {layers}+{layers} FFN={ffn})",
        "torch.nn.Transformer",
        step(peer, lambda: peer(src, dec_in, kpm, causal)),
        step(ours, lambda: ours(src, dec_in, lens)),
        target=1.0,
        note=f"{B * L} target tokens per step; parameters qkv {n_ours:,}, torch {n_peer:,}",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    parser.add_argument("--only", choices=["decoding", "training"], help="run one case only")
    args = parser.parse_args(argv)
    results = []
    if args.only in (None, "decoding"):
        case = decoding_case(B=4, steps=16, D=64, layers=2) if args.quick else decoding_case()
        if args.quick:  # a smoke run: sizes too small for the targets to mean anything
            case.target = None
        # the peer takes seconds per call: few rounds are plenty for a ratio this large, and the
        # calibration call warms both up
        results += run_cases([case], repeats=min(args.repeats, 3), warmup=0, min_sample_ms=0)
    if args.only in (None, "training"):
        case = (
            training_case(B=8, L=16, D=64, heads=4, layers=2, ffn=128)
            if args.quick
            else training_case()
        )
        if args.quick:
            case.target = None
        results += run_cases([case], repeats=3 if args.quick else args.repeats, warmup=2)
    print_table(results, "qkv seq2seq (CPU): KV-cached decoding, training throughput")
    for r in results:
        if r.name.startswith("training"):
            tokens = int(r.note.split()[0])
            print(
                f"training tokens/s: qkv {tokens / r.qkv_ms * 1e3:,.0f}, "
                f"torch.nn.Transformer {tokens / r.peer_ms * 1e3:,.0f}  ({r.note})"
            )
        else:
            tokens = int(r.note.split()[0])
            print(
                f"decoding tokens/s: cached {tokens / r.qkv_ms * 1e3:,.0f}, "
                f"re-run prefix {tokens / r.peer_ms * 1e3:,.0f}"
            )
    if args.json:
        write_json(results, args.json, {"benchmark": "seq2seq", "quick": args.quick})


if __name__ == "__main__":
    main()
