"""Training throughput on the CPU: qkv against the book's own implementation (the d2l package).

Issue 7's target: target tokens per second of training at least 1.5x the book's, at the same
model size on the same data.

* **Model**: the book's machine-translation Transformer (d2l 11.7): ``num_hiddens=256``,
  ``ffn_num_hiddens=64``, 4 heads, 2 encoder and 2 decoder blocks, dropout 0.2, no attention
  biases; trained with gradient clipping at 1.
* **Data**: the same ``--pairs`` sentence pairs of the bundled corpus (book-normalised, word
  vocabularies with ``min_freq=2``), one call = one pass over all of them.
* **The book (peer)**: ``d2l`` 1.0.3's ``TransformerEncoder``, and the decoder of the book's
  chapter (``TransformerDecoderBlock``/``TransformerDecoder``, which the package does not ship),
  built from d2l's own ``MultiHeadAttention``, ``AddNorm``, ``PositionWiseFFN`` and
  ``PositionalEncoding``; the book's data layout (every sentence padded to ``num_steps``, batches
  of 128), its masked cross-entropy, Adam (lr 0.0015) and its ``Trainer.clip_gradients``.
* **qkv, two ways**: ``qkv.train.train_update`` (label-smoothed loss, AdamW, clipping, the
  inverse-sqrt schedule) on the qkv model ``build_model(...)`` of the same size,

  - ``book batches``: on exactly the book's padded batches, which isolates the model and the
    update;
  - ``token batches``: on ``TokenBatcher`` batches of the same pairs under the same budget of
    padded positions per batch (``128 * num_steps``): what ``qkv train`` does.

Tokens/s counts real (non-padding) target tokens, ``<eos>`` included; both sides process the same
ones, so the ratio of times is the ratio of tokens/s.

Needs the d2l package in the benchmark environment only, without its pinned dependencies::

    pip install --no-deps d2l==1.0.3

d2l imports torchvision, pandas, requests, IPython and matplotlib_inline at import time and uses
none of them here; missing ones are replaced by permissive stubs while it is imported.

Run: ``python -m benchmarks.train [--quick] [--pairs N] [--repeats N] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import math
import sys
import types
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from qkv.data import Batch, Normalizer, TokenBatcher, build_tokenizers, bundled_pairs, encode_pairs
from qkv.nn.seq2seq import Seq2SeqConfig, build_model
from qkv.train import InverseSqrtSchedule, TrainConfig, make_optimizer, train_update

from .runner import Case, add_arguments, print_table, run_cases, write_json

BOOK = dict(num_hiddens=256, ffn_num_hiddens=64, num_heads=4, num_blks=2, dropout=0.2)
BATCH_SIZE = 128
PAD, BOS, EOS = 0, 1, 2


# ---------------------------------------------------------------------------- importing d2l
class _Anything(types.ModuleType):
    """A module whose every attribute is a class that accepts anything."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: set[str]) -> None:
        self.roots = roots

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Anything(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def import_d2l():
    """``d2l.torch``, with stubs for the import-time dependencies that are not installed."""
    missing = set()
    for name in ("torchvision", "pandas", "requests", "IPython", "matplotlib_inline", "scipy"):
        try:
            importlib.import_module(name)
        except Exception:
            sys.modules.pop(name, None)
            missing.add(name)
    finder = _StubFinder(missing)
    sys.meta_path.insert(0, finder)
    try:
        return importlib.import_module("d2l.torch")
    except ImportError as e:
        raise SystemExit(
            f"benchmarks.train needs the d2l package: pip install --no-deps d2l==1.0.3 ({e})"
        ) from None
    finally:
        sys.meta_path.remove(finder)


# ---------------------------------------------------------------------------- the book's model
def book_model(d2l, src_vocab: int, tgt_vocab: int) -> nn.Module:
    """The book's Transformer: d2l's encoder and the chapter's decoder, from d2l's modules."""
    h, f, H, n, p = (BOOK[k] for k in ("num_hiddens", "ffn_num_hiddens", "num_heads",
                                        "num_blks", "dropout"))  # fmt: skip

    class DecoderBlock(nn.Module):
        # the chapter's decoder block: masked self-attention over the prefix seen so far,
        # attention over the encoder outputs, feed-forward; each followed by d2l.AddNorm
        def __init__(self, i: int) -> None:
            super().__init__()
            self.i = i
            self.attention1 = d2l.MultiHeadAttention(h, H, p)
            self.addnorm1 = d2l.AddNorm(h, p)
            self.attention2 = d2l.MultiHeadAttention(h, H, p)
            self.addnorm2 = d2l.AddNorm(h, p)
            self.ffn = d2l.PositionWiseFFN(f, h)
            self.addnorm3 = d2l.AddNorm(h, p)

        def forward(self, X, state):
            enc_outputs, enc_valid_lens, cache = state
            kv = X if cache[self.i] is None else torch.cat((cache[self.i], X), dim=1)
            cache[self.i] = kv
            lens = None
            if self.training:  # query t sees keys 1..t
                B, T, _ = X.shape
                lens = torch.arange(1, T + 1, device=X.device).repeat(B, 1)
            Y = self.addnorm1(X, self.attention1(X, kv, kv, lens))
            Z = self.addnorm2(Y, self.attention2(Y, enc_outputs, enc_outputs, enc_valid_lens))
            return self.addnorm3(Z, self.ffn(Z)), state

    class Decoder(d2l.Decoder):
        def __init__(self) -> None:
            super().__init__()
            self.num_hiddens = h
            self.embedding = nn.Embedding(tgt_vocab, h)
            self.pos_encoding = d2l.PositionalEncoding(h, p)
            self.blks = nn.Sequential(*(DecoderBlock(i) for i in range(n)))
            self.dense = nn.LazyLinear(tgt_vocab)

        def init_state(self, enc_outputs, enc_valid_lens):
            return [enc_outputs, enc_valid_lens, [None] * n]

        def forward(self, X, state):
            X = self.pos_encoding(self.embedding(X) * math.sqrt(self.num_hiddens))
            for blk in self.blks:
                X, state = blk(X, state)
            return self.dense(X), state

    encoder = d2l.TransformerEncoder(src_vocab, h, f, H, n, p)
    model = d2l.Seq2Seq(encoder, Decoder(), tgt_pad=PAD, lr=0.0015)
    return model


def book_loss(Y_hat: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """The book's masked cross-entropy: mean over the non-padding target positions."""
    per = F.cross_entropy(Y_hat.reshape(-1, Y_hat.shape[-1]), Y.reshape(-1), reduction="none")
    mask = (Y.reshape(-1) != PAD).float()
    return (per * mask).sum() / mask.sum()


# ---------------------------------------------------------------------------- data
def _padded_batches(src_ids, tgt_ids, num_steps: int) -> list[Batch]:
    """The book's layout: every sentence padded to ``num_steps``, batches of 128 in order."""
    out = []
    for a in range(0, len(src_ids), BATCH_SIZE):
        s, t = src_ids[a : a + BATCH_SIZE], tgt_ids[a : a + BATCH_SIZE]
        B = len(s)
        src = torch.full((B, num_steps), PAD)
        tin = torch.full((B, num_steps), PAD)
        tout = torch.full((B, num_steps), PAD)
        for r, (x, y) in enumerate(zip(s, t)):
            src[r, : len(x) + 1] = torch.tensor([*x, EOS])
            tin[r, : len(y) + 1] = torch.tensor([BOS, *y])
            tout[r, : len(y) + 1] = torch.tensor([*y, EOS])
        out.append(
            Batch(
                src=src,
                src_valid_lens=torch.tensor([len(x) + 1 for x in s]),
                tgt_in=tin,
                tgt_out=tout,
                tgt_valid_lens=torch.tensor([len(y) + 1 for y in t]),
                indices=torch.arange(a, a + B),
            )
        )
    return out


def build(n_pairs: int) -> tuple[list[Case], dict]:
    torch.manual_seed(0)
    d2l = import_d2l()
    pairs = Normalizer.book().pairs(bundled_pairs()[:n_pairs])
    src_tok, tgt_tok = build_tokenizers(pairs, "word", normalizer=Normalizer.book(), min_freq=2)
    src_ids, tgt_ids = encode_pairs(pairs, src_tok, tgt_tok, pre_normalized=True)
    num_steps = max(max(len(s), len(t)) for s, t in zip(src_ids, tgt_ids)) + 1
    tokens = sum(len(t) + 1 for t in tgt_ids)
    book_batches = _padded_batches(src_ids, tgt_ids, num_steps)
    token_batches = list(
        TokenBatcher(
            src_ids, tgt_ids, max_tokens=BATCH_SIZE * num_steps, shuffle=True, rank=0, world_size=1
        )
    )
    V_src, V_tgt = src_tok.vocab_size, tgt_tok.vocab_size

    # the book: d2l's model, loss, Adam and clipping
    peer = book_model(d2l, V_src, V_tgt)
    b0 = book_batches[0]
    peer(b0.src, b0.tgt_in, b0.src_valid_lens)  # materialise the LazyLinear layers
    peer_opt = peer.configure_optimizers()
    clip = d2l.Trainer.clip_gradients

    def peer_epoch() -> None:
        peer.train()
        for b in book_batches:
            loss = book_loss(peer(b.src, b.tgt_in, b.src_valid_lens), b.tgt_out)
            peer_opt.zero_grad()
            with torch.no_grad():
                loss.backward()
                clip(None, 1, peer)
                peer_opt.step()

    # qkv: the same size, train_update as qkv train runs it
    cfg = Seq2SeqConfig(
        V_src,
        V_tgt,
        num_hiddens=BOOK["num_hiddens"],
        ffn_num_hiddens=BOOK["ffn_num_hiddens"],
        num_heads=BOOK["num_heads"],
        num_enc_layers=BOOK["num_blks"],
        num_dec_layers=BOOK["num_blks"],
        dropout=BOOK["dropout"],
    )
    tcfg = TrainConfig(lr=0.0015, warmup_steps=100, clip_norm=1.0)

    def qkv_epoch_fn(batches: list[Batch]) -> Callable[[], None]:
        model = build_model(cfg).train()
        opt = make_optimizer(model, tcfg)
        sched = InverseSqrtSchedule(opt, peak_lr=tcfg.lr, warmup_steps=tcfg.warmup_steps)
        dev = torch.device("cpu")

        def epoch() -> None:
            for b in batches:
                train_update(model, opt, sched, [b], label_smoothing=0.1, clip_norm=1.0, device=dev)

        return epoch

    n_params_peer = sum(p.numel() for p in peer.parameters())
    n_params_qkv = sum(p.numel() for p in build_model(cfg).parameters())
    padded = lambda bs: sum(b.tgt_out.numel() for b in bs)  # noqa: E731
    meta = {
        "pairs": n_pairs,
        "target_tokens_per_call": tokens,
        "num_steps": num_steps,
        "params_book": n_params_peer,
        "params_qkv": n_params_qkv,
        "book_batches": len(book_batches),
        "token_batches": len(token_batches),
        "padded_target_positions_book": padded(book_batches),
        "padded_target_positions_token_batches": padded(token_batches),
    }
    note = f"{tokens} target tokens per call"
    cases = [
        Case("train, book batches", "d2l (book)", peer_epoch, qkv_epoch_fn(book_batches),
             target=None, note=note),
        Case("train, token batches", "d2l (book)", peer_epoch, qkv_epoch_fn(token_batches),
             target=1.5, note=note),
    ]  # fmt: skip
    return cases, meta


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    ap.add_argument("--pairs", type=int, default=2048, help="sentence pairs per call")
    args = ap.parse_args(argv)
    n = 512 if args.quick else args.pairs
    repeats = 3 if args.quick else args.repeats
    cases, meta = build(n)
    print(
        f"{meta['pairs']} pairs, {meta['target_tokens_per_call']} target tokens per call; "
        f"book: {meta['book_batches']} batches of {BATCH_SIZE} x {meta['num_steps']} "
        f"({meta['padded_target_positions_book']} padded target positions), qkv token batches: "
        f"{meta['token_batches']} ({meta['padded_target_positions_token_batches']}); "
        f"parameters book {meta['params_book']}, qkv {meta['params_qkv']}"
    )
    results = run_cases(cases, repeats=repeats, warmup=1 if args.quick else 2, min_sample_ms=0)
    print_table(results, "training throughput, CPU (ratio = book time / qkv time)")
    tokens = meta["target_tokens_per_call"]
    for r in results:
        print(
            f"{r.name}: book {tokens / r.peer_ms * 1e3:,.0f} tok/s, "
            f"qkv {tokens / r.qkv_ms * 1e3:,.0f} tok/s, ratio {r.ratio:.2f}x"
        )
    if args.json:
        write_json(results, args.json, meta)


if __name__ == "__main__":
    main()
