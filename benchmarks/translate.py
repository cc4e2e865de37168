"""Translation speed side by side: qkv, the eager-PyTorch limit, CTranslate2 and Hugging Face.

Issue 30's layout, one model decoded by every system in one process run: a post-norm Transformer
256 wide, 3+3 layers, 4 heads, FFN 1024, a shared 8k vocabulary, random weights with the EOS
logit pushed down so that every system emits the same number of tokens (``--out-len``); 200
sources of random ids whose lengths are log-normal between 5 and 27 tokens, in input order.
A *mode* is a search (greedy, beam 4), a thread count (2 and 1) and a batching:

* **batch 32**: every system decodes the same batches of 32 sentences, in input order;
* **own batching**: each engine batches all the sentences its own way, sorted by length, with
  the same budget of 4,096 (``Decoding().max_tokens``) padded source tokens a batch: CTranslate2
  by ``max_batch_size`` with ``batch_type="tokens"``, qkv by its token budget
  (:func:`qkv.inference.generate_ids`, what ``qkv translate --batch-tokens`` runs) set to 4,096
  times the beam. The two settings count differently: CTranslate2 charges a sentence its source
  length whatever the beam, ``Decoding.max_tokens`` charges its source length times the beam
  (the rows a batch decodes). Giving qkv the same number, 4,096, had it decode beam 4 in
  batches of 1,024 source tokens (4 batches of the 200 sentences, 85 down to 10 of them) while
  CTranslate2 decoded up to 4,096 (the 200 sentences hold 2,490: one or two batches): a
  quarter of the batch, which cost qkv most at 2 threads. Both now batch the same source
  tokens (qkv: 2 batches, 183 and 17 sentences).

The systems:

* **qkv fp32**: :func:`qkv.decoding.generate` per batch (own batching:
  :func:`qkv.inference.generate_ids`);
* **qkv int8**: the same on :func:`qkv.inference.quantize_model` (``--quantize int8``);
* **tight loop**: the eager-PyTorch limit (:class:`TightLoop`): fused projections, the cross
  keys/values projected once, a preallocated cache written in place, SDPA and ``F.layer_norm``,
  no per-step check;
* **plain loop**: the earlier baseline, a KV cache grown by ``torch.cat`` through the modules;
* **ct2 fp32 / ct2 int8**: CTranslate2 on the model :func:`qkv.export.ctranslate2.to_spec`
  converts (skipped with a note when ctranslate2 or that module is missing);
* **qkv engine ct2**: ``qkv translate --engine ctranslate2`` (batch 32 rows; it batches 32
  sentences sorted by length, its own rule);
* **HF generate**: Hugging Face ``MarianMTModel.generate`` on a ``MarianConfig`` of the same
  shape with the same weights (no download; skipped with a note without ``transformers``).

Each round runs every system of a mode once over all the sentences, in a rotated order; the
table gives the median seconds (after a warm-up on 32 sentences), sentences/s and target
tokens/s, and how many outputs equal qkv fp32's token for token. Last come the ratios the issue
asks for, each naming its target (> 1: qkv faster): qkv fp32 >= 1x the tight loop, >= 0.9x
CTranslate2 fp32 at 2 threads and >= 0.75x at 1 thread; qkv int8 >= 0.7x CTranslate2 int8.

Run: ``python -m benchmarks.translate [--quick] [--repeats N] [--json PATH] [--sentences N]
[--out-len T] [--threads 2,1] [--only greedy|beam] [--batching 32,own]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from qkv.decoding import generate
from qkv.inference import Decoding, generate_ids, quantize_model
from qkv.nn.position import sinusoidal_encoding
from qkv.nn.seq2seq import build_model

PAD, BOS, EOS = 0, 1, 2
Batches = list[tuple[Tensor, Tensor]]
#: a system: the sentences' ids (no EOS) in, each sentence's output ids out
System = Callable[[list[list[int]]], list[list[int]]]
#: the source-token budget of "own batching" (qkv's default Decoding.max_tokens; CTranslate2's
#: max_batch_size in tokens; qkv's max_tokens is this times the beam, see the docstring)
BUDGET = Decoding().max_tokens


def make_model(vocab: int = 8000) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = dict(
        src_vocab_size=vocab,
        tgt_vocab_size=vocab,
        num_hiddens=256,
        ffn_num_hiddens=1024,
        num_heads=4,
        num_enc_layers=3,
        num_dec_layers=3,
        dropout=0.0,
        share_embeddings=True,
        tie_embeddings=False,
    )
    model = build_model(cfg).eval()
    with torch.no_grad():
        model.decoder.dense.bias[EOS] = -1e4  # never stops early: a forced output length
    return model


def make_sources(n: int, vocab: int, seed: int = 1) -> list[list[int]]:
    """``n`` sources of random ids (no EOS), in input order; lengths log-normal (median 11.6,
    sigma 0.4) clipped to 5..27."""
    g = torch.Generator().manual_seed(seed)
    lens = (torch.randn(n, generator=g) * 0.4 + math.log(11.6)).exp().round().clamp(5, 27)
    return [torch.randint(4, vocab, (int(L),), generator=g).tolist() for L in lens]


def make_batches(srcs: list[list[int]], size: int = 32) -> Batches:
    """Batches of ``size`` sources in the given order, EOS appended, right-padded."""
    out = []
    for i in range(0, len(srcs), size):
        rows = [[*s, EOS] for s in srcs[i : i + size]]
        src = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
        for r, ids in enumerate(rows):
            src[r, : len(ids)] = torch.tensor(ids)
        out.append((src, torch.tensor([len(r) for r in rows])))
    return out


# ---------------------------------------------------------------------------- the tight loop
class TightLoop:
    """The eager-PyTorch limit: what anyone can write for this model in plain PyTorch, with
    nothing around the math (issue 30).

    The weights are taken once: every self-attention's Q, K and V projected by one fused matrix,
    the cross-attention's K and V by one; the cross keys and values are projected once per batch;
    a self-attention cache preallocated for the whole output, written in place;
    ``F.scaled_dot_product_attention``, ``F.layer_norm``, ``F.linear``; greedy and beam search
    with no per-step check (a forced length: no EOS handling, no early exit). Beam search keeps
    ``K`` rows per sentence, reorders the written part of the cache into a second buffer at every
    step (one copy), and its beams read their sentence's cross keys and values as ``K`` queries of
    one row. A post-norm model with sinusoidal positions (the benchmark's)."""

    def __init__(self, model: torch.nn.Module) -> None:
        c = model.config
        if c.norm_first or c.pos_encoding != "sinusoidal" or c.activation != "relu":
            raise ValueError("the tight loop is written for the benchmark's post-norm model")
        self.H, self.D, self.d = c.num_heads, c.num_hiddens, c.num_hiddens // c.num_heads
        self.scale = math.sqrt(self.D)
        self.P = sinusoidal_encoding(torch.arange(1024), self.D)

        def lin(*ms) -> tuple[Tensor, Tensor | None]:  # one matrix for several layers
            w = torch.cat([m.weight.detach() for m in ms])
            if all(m.bias is None for m in ms):
                return w, None
            zero = [torch.zeros(m.weight.shape[0]) for m in ms]
            return w, torch.cat(
                [z if m.bias is None else m.bias.detach() for m, z in zip(ms, zero)]
            )

        def ln(a) -> tuple[Tensor, Tensor, float]:
            return a.ln.weight.detach(), a.ln.bias.detach(), a.ln.eps

        enc, dec = model.encoder, model.decoder
        self.src_emb, self.tgt_emb = enc.embedding.weight.detach(), dec.embedding.weight.detach()
        self.enc = []
        for b in enc.blks:
            a = b.attention
            ffn = (lin(b.ffn.dense1), lin(b.ffn.dense2), ln(b.addnorm2))
            self.enc.append((lin(a.W_q, a.W_k, a.W_v), lin(a.W_o), ln(b.addnorm1), *ffn))
        self.dec = []
        for b in dec.blks:
            a1, a2 = b.attention1, b.attention2
            own = (lin(a1.W_q, a1.W_k, a1.W_v), lin(a1.W_o), ln(b.addnorm1))
            cross = (lin(a2.W_q), lin(a2.W_k, a2.W_v), lin(a2.W_o), ln(b.addnorm2))
            self.dec.append((*own, *cross, lin(b.ffn.dense1), lin(b.ffn.dense2), ln(b.addnorm3)))
        self.out = lin(dec.dense)
        self.banned = torch.tensor([PAD, BOS])

    def encode(self, src: Tensor, lens: Tensor) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
        """Every decoder layer's cross keys and values ``(B, H, Ls, d)`` and the source mask."""
        B, L = src.shape
        H, D, d = self.H, self.D, self.d
        x = F.embedding(src, self.src_emb) * self.scale + self.P[:L]
        mask = (torch.arange(L) < lens[:, None])[:, None, None, :]  # (B, 1, 1, Ls)
        for qkv, o, ln1, f1, f2, ln2 in self.enc:
            q, k, v = F.linear(x, *qkv).view(B, L, 3, H, d).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = F.layer_norm(x + F.linear(a.transpose(1, 2).reshape(B, L, D), *o), (D,), *ln1)
            x = F.layer_norm(x + F.linear(F.relu(F.linear(x, *f1)), *f2), (D,), *ln2)
        cross = []
        for blk in self.dec:
            k, v = F.linear(x, *blk[4]).view(B, L, 2, H, d).permute(2, 0, 3, 1, 4)
            cross.append((k, v))
        return cross, mask

    def step(self, tok: Tensor, t: int, ck: Tensor, cv: Tensor, cross: list, mask: Tensor, K: int):
        """Logits ``(N, V)`` of position ``t`` for the tokens ``tok`` ``(N,)``; the new keys and
        values are written at ``t`` of the caches ``(layers, N, H, T, d)``; ``K`` queries of each
        cross row (the beams of one sentence)."""
        N = tok.shape[0]
        H, D, d = self.H, self.D, self.d
        x = F.embedding(tok, self.tgt_emb) * self.scale + self.P[t]
        for i, (qkv, o, ln1, q2, _, o2, ln2, f1, f2, ln3) in enumerate(self.dec):
            q, k, v = F.linear(x, *qkv).view(N, 3, H, 1, d).unbind(1)
            ck[i, :, :, t : t + 1] = k
            cv[i, :, :, t : t + 1] = v
            a = F.scaled_dot_product_attention(q, ck[i, :, :, : t + 1], cv[i, :, :, : t + 1])
            x = F.layer_norm(x + F.linear(a.view(N, D), *o), (D,), *ln1)
            q = F.linear(x, *q2).view(N // K, K, H, d).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, *cross[i], attn_mask=mask)
            x = F.layer_norm(x + F.linear(a.transpose(1, 2).reshape(N, D), *o2), (D,), *ln2)
            x = F.layer_norm(x + F.linear(F.relu(F.linear(x, *f1)), *f2), (D,), *ln3)
        return F.linear(x, *self.out)

    @torch.inference_mode()
    def search(self, src: Tensor, lens: Tensor, steps: int, beam: int = 1) -> list[list[int]]:
        cross, mask = self.encode(src, lens)
        B, K, layers = src.shape[0], beam, len(self.dec)
        cache = src.new_empty((2, layers, B * K, self.H, steps, self.d), dtype=torch.float32)
        out = torch.empty(B * K, steps, dtype=torch.long)
        tok = torch.full((B,), BOS)
        if K == 1:
            for t in range(steps):
                logits = self.step(tok, t, cache[0], cache[1], cross, mask, 1)
                tok = logits.index_fill_(1, self.banned, -math.inf).argmax(-1)
                out[:, t] = tok
            return out.tolist()
        # beam: the first step on one row per sentence, its keys copied to the K beams
        spare = torch.empty_like(cache)
        logp = self.step(tok, 0, spare[0, :, :B], spare[1, :, :B], cross, mask, 1).log_softmax(-1)
        rep = torch.arange(B).repeat_interleave(K)
        torch.index_select(spare[:, :, :B, :, :1], 2, rep, out=cache[:, :, :, :, :1])
        scores, idx = logp.index_fill_(1, self.banned, -math.inf).topk(K, dim=1)  # (B, K)
        tok = idx.view(-1)
        out[:, 0] = tok
        base = (torch.arange(B) * K)[:, None]
        for t in range(1, steps):
            logp = self.step(tok, t, cache[0], cache[1], cross, mask, K).log_softmax(-1)
            logp.index_fill_(1, self.banned, -math.inf)
            V = logp.shape[-1]
            scores, idx = (logp.view(B, K, V) + scores[..., None]).view(B, K * V).topk(K, dim=1)
            rows = (base + torch.div(idx, V, rounding_mode="floor")).view(-1)
            torch.index_select(cache[..., : t + 1, :], 2, rows, out=spare[..., : t + 1, :])
            cache, spare = spare, cache
            tok = (idx % V).view(-1)
            out = out.index_select(0, rows)
            out[:, t] = tok
        return out[::K].tolist()  # the best of each sentence (all of one length)


# ---------------------------------------------------------------------------- the plain loop
class PlainLoop:
    """Greedy and beam search in plain PyTorch over a qkv post-norm model's weights: a KV cache
    grown by ``torch.cat``, SDPA, no validation (forced length: no EOS handling needed)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.m, self.H = model, model.config.num_heads
        self.D = model.config.num_hiddens
        self.P = sinusoidal_encoding(torch.arange(1024), self.D)

    def _heads(self, x: Tensor) -> Tensor:  # (B, L, D) -> (B, H, L, d)
        return x.unflatten(-1, (self.H, -1)).transpose(1, 2)

    def _attend(self, att, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        out = F.scaled_dot_product_attention(self._heads(att.W_q(q)), k, v, attn_mask=mask)
        return att.W_o(out.transpose(1, 2).flatten(2))

    def _embed(self, emb, ids: Tensor, start: int) -> Tensor:
        return emb(ids) * math.sqrt(self.D) + self.P[start : start + ids.shape[1]]

    def encode(self, src: Tensor, lens: Tensor) -> tuple[list, Tensor]:
        enc, x = self.m.encoder, self._embed(self.m.encoder.embedding, src, 0)
        mask = (torch.arange(src.shape[1]) < lens[:, None])[:, None, None, :]
        for b in enc.blks:
            a = b.attention
            kv = self._heads(a.W_k(x)), self._heads(a.W_v(x))
            x = b.addnorm1(x, self._attend(a, x, *kv, mask))
            x = b.addnorm2(x, b.ffn(x))
        cross = [
            (self._heads(b.attention2.W_k(x)), self._heads(b.attention2.W_v(x)))
            for b in self.m.decoder.blks
        ]
        return cross, mask

    def step(self, tok: Tensor, t: int, cache: list, cross: list, mask: Tensor) -> Tensor:
        dec, x = self.m.decoder, self._embed(self.m.decoder.embedding, tok, t)
        for i, b in enumerate(dec.blks):
            a = b.attention1
            k, v = self._heads(a.W_k(x)), self._heads(a.W_v(x))
            if cache[i] is not None:
                k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
            x = b.addnorm1(x, self._attend(a, x, k, v, None))
            x = b.addnorm2(x, self._attend(b.attention2, x, *cross[i], mask))
            x = b.addnorm3(x, b.ffn(x))
        return dec.dense(x[:, -1])

    @torch.inference_mode()
    def search(self, src: Tensor, lens: Tensor, steps: int, beam: int = 1) -> list[list[int]]:
        cross, mask = self.encode(src, lens)
        B, K = src.shape[0], beam
        if K > 1:
            rep = torch.arange(B).repeat_interleave(K)
            cross, mask = [(k[rep], v[rep]) for k, v in cross], mask[rep]
        tok = torch.full((B * K, 1), BOS)
        out, scores = tok[:, :0], torch.zeros(B, K)
        scores[:, 1:] = -math.inf
        cache: list = [None] * len(self.m.decoder.blks)
        base = (torch.arange(B) * K)[:, None]
        for t in range(steps):
            logp = self.step(tok, t, cache, cross, mask)
            logp[:, [PAD, BOS]] = -math.inf
            if K == 1:
                tok = logp.argmax(-1, keepdim=True)
                out = torch.cat([out, tok], 1)
                continue
            logp = logp.log_softmax(-1).view(B, K, -1) + scores[..., None]
            scores, idx = logp.flatten(1).topk(K, dim=1)
            rows = (base + idx // logp.shape[-1]).flatten()
            cache = [(k[rows], v[rows]) for k, v in cache]
            tok = (idx % logp.shape[-1]).view(-1, 1)
            out = torch.cat([out[rows], tok], 1)
        return out.tolist() if K == 1 else out[::K].tolist()  # beam: the best of each sentence


# ---------------------------------------------------------------------------- CTranslate2
def ct2_folder(model: torch.nn.Module, folder: Path) -> list[str] | None:
    """The model converted by :func:`qkv.export.ctranslate2.to_spec` into ``folder``; its
    vocabulary, or None (a note printed) without ctranslate2."""
    try:
        import ctranslate2  # noqa: F401

        from qkv.export.ctranslate2 import to_spec
    except ImportError as e:
        print(f"note: CTranslate2 rows skipped ({e})")
        return None
    vocab = ["<pad>", "<bos>", "<eos>", "<unk>"]
    vocab += [f"w{i}" for i in range(4, model.config.tgt_vocab_size)]
    spec = to_spec(model)
    spec.register_source_vocabulary(vocab)
    spec.register_target_vocabulary(vocab)
    spec.validate()
    spec.optimize(quantization=None)
    folder.mkdir(parents=True)
    spec.save(str(folder))
    return vocab


def ct2_systems(folder: Path, vocab: list[str], mode: Mode, steps: int) -> dict[str, System]:
    """CTranslate2 fp32 and int8: batches of 32 in input order, or its own batching of all
    the sentences (``max_batch_size`` tokens, ``batch_type="tokens"``)."""
    import ctranslate2

    index = {t: i for i, t in enumerate(vocab)}
    own = mode.own_batching
    batching = dict(max_batch_size=BUDGET, batch_type="tokens") if own else {}

    def system(compute_type: str) -> System:
        tr = ctranslate2.Translator(
            str(folder), compute_type=compute_type, inter_threads=1, intra_threads=mode.threads
        )

        def run(srcs: list[list[int]]) -> list[list[int]]:
            tokens = [[vocab[i] for i in s] for s in srcs]
            groups = [tokens] if own else [tokens[i : i + 32] for i in range(0, len(tokens), 32)]
            out = []
            for g in groups:
                res = tr.translate_batch(
                    g,
                    beam_size=mode.beam,
                    max_decoding_length=steps,
                    min_decoding_length=0,
                    max_input_length=0,
                    suppress_sequences=[["<pad>"], ["<bos>"]],
                    **batching,
                )
                out += [[index[t] for t in r.hypotheses[0]] for r in res]
            return out

        return run

    return {"ct2 fp32": system("float32"), "ct2 int8": system("int8")}


def engine_system(model, steps: int, mode: Mode, folder: Path) -> dict[str, System]:
    """``qkv translate --engine ctranslate2``: the model saved with word tokenizers over the
    benchmark's vocabulary, exported by ``qkv export --format ctranslate2``, and translated from
    text by :class:`qkv.export.ctranslate2.Ct2Translator` (what the command runs), or {}."""
    try:
        import ctranslate2  # noqa: F401

        from qkv.export.ctranslate2 import Ct2Translator, export_ctranslate2
    except ImportError as e:
        print(f"note: the --engine ctranslate2 row skipped ({e})")
        return {}
    from qkv.data import Vocab, WordTokenizer
    from qkv.inference import save_model

    if not (folder / "exported").exists():
        tok = WordTokenizer(Vocab(f"w{i}" for i in range(4, model.config.tgt_vocab_size)))
        save_model(model, tok, tok, folder / "saved")
        export_ctranslate2(folder / "saved", folder / "exported")
    ct2 = Ct2Translator(folder / "exported", threads=mode.threads)

    def run(srcs: list[list[int]]) -> list[list[int]]:
        texts = [" ".join(f"w{i}" for i in s) for s in srcs]
        return ct2.generate(texts, beam_size=mode.beam, max_output_len=steps)

    return {"qkv engine ct2": run}


# ---------------------------------------------------------------------------- Hugging Face
def hf_system(model, steps: int, beam: int) -> dict[str, System]:
    """``MarianMTModel.generate`` on the same weights, or {} (a note printed)."""
    try:
        from transformers import MarianConfig, MarianMTModel
    except ImportError:
        print("note: HF generate rows skipped (transformers is not installed)")
        return {}
    c = model.config
    cfg = MarianConfig(
        vocab_size=c.src_vocab_size,
        decoder_vocab_size=c.tgt_vocab_size,
        d_model=c.num_hiddens,
        encoder_layers=c.num_enc_layers,
        decoder_layers=c.num_dec_layers,
        encoder_attention_heads=c.num_heads,
        decoder_attention_heads=c.num_heads,
        encoder_ffn_dim=c.ffn_num_hiddens,
        decoder_ffn_dim=c.ffn_num_hiddens,
        activation_function=c.activation,
        max_position_embeddings=1024,
        scale_embedding=True,
        dropout=0.0,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
        forced_eos_token_id=None,
        share_encoder_decoder_embeddings=c.share_embeddings,
        tie_word_embeddings=c.tie_embeddings,
    )
    hf = MarianMTModel(cfg).eval()
    m, P = hf.model, sinusoidal_encoding(torch.arange(1024), c.num_hiddens)  # qkv's layout

    def copy(dst, src) -> None:
        dst.weight.copy_(src.weight)
        if getattr(dst, "bias", None) is not None:
            dst.bias.copy_(src.bias if src.bias is not None else torch.zeros_like(dst.bias))

    with torch.no_grad():
        for side, q in ((m.encoder, model.encoder), (m.decoder, model.decoder)):
            side.embed_tokens.weight.copy_(q.embedding.weight)
            side.embed_positions.weight.copy_(P)
        for h, q in zip(m.encoder.layers, model.encoder.blks):
            a, s = q.attention, h.self_attn
            pairs = [(s.q_proj, a.W_q), (s.k_proj, a.W_k), (s.v_proj, a.W_v), (s.out_proj, a.W_o)]
            pairs += [(h.fc1, q.ffn.dense1), (h.fc2, q.ffn.dense2)]
            pairs += [(h.self_attn_layer_norm, q.addnorm1.ln), (h.final_layer_norm, q.addnorm2.ln)]
            for d, s_ in pairs:
                copy(d, s_)
        for h, q in zip(m.decoder.layers, model.decoder.blks):
            pairs = []
            for hs, qa in ((h.self_attn, q.attention1), (h.encoder_attn, q.attention2)):
                pairs += [(hs.q_proj, qa.W_q), (hs.k_proj, qa.W_k), (hs.v_proj, qa.W_v)]
                pairs += [(hs.out_proj, qa.W_o)]
            pairs += [(h.fc1, q.ffn.dense1), (h.fc2, q.ffn.dense2)]
            pairs += [(h.self_attn_layer_norm, q.addnorm1.ln)]
            pairs += [(h.encoder_attn_layer_norm, q.addnorm2.ln)]
            pairs += [(h.final_layer_norm, q.addnorm3.ln)]
            for d, s_ in pairs:
                copy(d, s_)
        hf.lm_head.weight.copy_(model.decoder.dense.weight)
        hf.final_logits_bias.copy_(model.decoder.dense.bias.view(1, -1))

    @torch.inference_mode()
    def run(srcs: list[list[int]]) -> list[list[int]]:
        out = []
        for src, lens in make_batches(srcs):
            mask = (torch.arange(src.shape[1]) < lens[:, None]).long()
            ids = hf.generate(
                input_ids=src,
                attention_mask=mask,
                num_beams=beam,
                do_sample=False,
                max_new_tokens=steps,
                min_new_tokens=0,
                suppress_tokens=[PAD, BOS],
            )
            out += ids[:, 1:].tolist()
        return out

    return {"HF generate": run}


# ---------------------------------------------------------------------------- the run
class Mode:
    """A search, a thread count and a batching: one table of the benchmark."""

    def __init__(self, search: str, threads: int, own_batching: bool) -> None:
        self.search, self.threads, self.own_batching = search, threads, own_batching
        self.beam = 1 if search == "greedy" else int(search.split()[-1])

    @property
    def name(self) -> str:
        """``"greedy"`` and ``"beam 4"`` for batch 32 at 2 threads (README's first rows),
        else with what differs: ``"beam 4, own batching, 1 thread"``."""
        name = self.search + (", own batching" if self.own_batching else "")
        return name if self.threads == 2 else f"{name}, {_threads(self.threads)}"

    @property
    def layout(self) -> str:
        how = "each engine's own batching" if self.own_batching else "batch 32 in input order"
        return f"{how}, {_threads(self.threads)}"


def _threads(n: int) -> str:
    return f"{n} thread{'s' if n > 1 else ''}"


class Setup:
    """What every mode shares: the model, its int8 copy, the forced length, the CTranslate2
    model's vocabulary (None without ctranslate2) and the folder of the converted models."""

    def __init__(self, steps: int, folder: Path) -> None:
        self.model = make_model()
        self.int8 = quantize_model(self.model)
        self.steps, self.folder = steps, folder
        self.ct2_vocab = ct2_folder(self.model, folder / "ct2")

    def systems(self, mode: Mode) -> dict[str, System]:
        """Every system of ``mode``, each a call that decodes the sentences it is given (the
        warm-up and the timed rounds call the same objects)."""
        steps, beam = self.steps, mode.beam
        if mode.own_batching:  # qkv's token budget over all the sentences
            # max_tokens counts source tokens times the beam, CTranslate2's budget source tokens
            dec = Decoding(beam_size=beam, max_output_len=steps, max_tokens=BUDGET * beam)

            def qkv(m) -> System:
                def run(srcs: list[list[int]]) -> list[list[int]]:
                    ids = [[*s, EOS] for s in srcs]
                    return generate_ids(m, ids, bos_id=BOS, eos_id=EOS, decoding=dec)

                return run

        else:

            def qkv(m) -> System:
                def run(srcs: list[list[int]]) -> list[list[int]]:
                    out = []
                    for src, lens in make_batches(srcs):
                        kw = dict(max_output_len=steps, bos_id=BOS, eos_id=EOS, beam_size=beam)
                        out += generate(m, src, lens, **kw)
                    return out

                return run

        systems = {"qkv fp32": qkv(self.model), "qkv int8": qkv(self.int8)}
        if not mode.own_batching:
            for name, loop in (("tight loop", TightLoop), ("plain loop", PlainLoop)):
                systems[name] = _per_batch(loop(self.model).search, steps, beam)
        if self.ct2_vocab is not None:
            systems |= ct2_systems(self.folder / "ct2", self.ct2_vocab, mode, steps)
        if not mode.own_batching:
            systems |= engine_system(self.model, steps, mode, self.folder / "engine")
            systems |= hf_system(self.model, steps, beam)
        return systems


def _per_batch(search: Callable, steps: int, beam: int) -> System:
    """A loop's ``search(src, lens, steps, beam)`` over batches of 32 in input order."""

    def run(srcs: list[list[int]]) -> list[list[int]]:
        return [r for src, lens in make_batches(srcs) for r in search(src, lens, steps, beam)]

    return run


def time_systems(
    systems: dict[str, System], srcs: list[list[int]], repeats: int, warm: int = 32
) -> tuple[dict, dict]:
    """Seconds per system over ``repeats`` rounds on ``srcs`` in rotated order, after one
    warm-up call of each on the first ``warm`` sentences; and each system's first outputs."""
    names, outs = list(systems), {}
    for name in names:
        systems[name](srcs[:warm])
    secs: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            out = systems[name](srcs)
            secs[name].append(time.perf_counter() - t0)
            outs.setdefault(name, out)
    return secs, outs


def targets(mode: Mode) -> tuple[tuple[str, str, str, float | None], ...]:
    """``(label, faster system, slower system, target)`` of issue 30 for ``mode``."""
    ct2 = 0.9 if mode.threads >= 2 else 0.75
    return (
        ("qkv fp32 vs tight loop", "qkv fp32", "tight loop", 1.0),
        ("qkv fp32 vs plain loop", "qkv fp32", "plain loop", 1.0),
        ("qkv fp32 vs ct2 fp32", "qkv fp32", "ct2 fp32", ct2),
        ("qkv int8 vs ct2 int8", "qkv int8", "ct2 int8", 0.7),
        ("qkv --engine ctranslate2 vs ct2 fp32", "qkv engine ct2", "ct2 fp32", 0.9),
        ("qkv fp32 vs HF generate", "qkv fp32", "HF generate", None),
    )


def report(mode: Mode, n: int, steps: int, secs: dict, outs: dict, load: tuple) -> dict:
    """The table of one mode (printed) and its record: every system's timings, the ratios of
    :func:`targets`, the load average when the mode started."""
    ref = outs["qkv fp32"]
    rows = {}
    print(f"\n{mode.name}: {n} sentences, {steps} target tokens each, {mode.layout}")
    print(f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start")
    print(f"{'system':<15} {'median s':>9} {'sent/s':>8} {'tok/s':>8}  same as qkv fp32")
    for name, s in secs.items():
        med = statistics.median(s)
        same = sum(a == b for a, b in zip(ref, outs[name]))
        rows[name] = {"median_s": med, "samples_s": s, "sentences_per_s": n / med}
        rows[name] |= {"tokens_per_s": n * steps / med, "same_as_qkv_fp32": same}
        print(f"{name:<15} {med:>9.3f} {n / med:>8.1f} {n * steps / med:>8.0f}  {same}/{n}")
    ratios = []
    for label, a, b, target in targets(mode):
        if a in rows and b in rows:
            r = rows[b]["median_s"] / rows[a]["median_s"]
            ratios.append({"case": label, "ratio": r, "target": target})
    block = {"search": mode.search, "beam": mode.beam, "threads": mode.threads}
    block |= {"batching": "own" if mode.own_batching else "batch 32", "load_at_start": load}
    return block | {"systems": rows, "ratios": ratios}


def print_ratios(results: dict) -> None:
    """Every ratio, last, each naming its target (> 1: qkv faster)."""
    print("\nratios (> 1: qkv faster), issue 30's targets:")
    for name, block in results.items():
        for r in block["ratios"]:
            t = r["target"]
            verdict = (
                ""
                if t is None
                else f" (target >= {t:g}x)" + ("  ok" if r["ratio"] >= t else "  MISSED")
            )
            print(f"{name}: {r['case']}: {r['ratio']:.2f}x{verdict}")


def _torch_config() -> dict:
    """torch's GEMM libraries and the CPU it runs on, recorded beside the figures."""
    cfg = torch.__config__.show()
    return {
        "cpu": platform.processor(),
        "mkl": torch.backends.mkl.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "blas": next((ln.strip() for ln in cfg.splitlines() if "BLAS_INFO" in ln), ""),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (median)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--quick", action="store_true", help="48 sentences, 8 tokens, 1 round")
    p.add_argument("--sentences", type=int, default=200)
    p.add_argument("--out-len", type=int, default=32, help="forced target tokens per sentence")
    p.add_argument("--threads", default="2,1", help="thread counts, comma-separated")
    p.add_argument("--only", choices=("greedy", "beam"))
    p.add_argument("--batching", default="32,own", help="32 (batch 32), own, or both")
    p.add_argument(
        "--marian",
        action="store_true",
        help="an OPUS-MT-sized MarianMTModel converted by CTranslate2's converter and imported "
        "by qkv import, batch 32 (benchmarks.translate_marian)",
    )
    args = p.parse_args(argv)
    n, steps, repeats = args.sentences, args.out_len, args.repeats
    if args.quick:
        n, steps, repeats = 48, 8, 1
    threads = [int(t) for t in args.threads.split(",")]
    batchings = [b.strip() == "own" for b in args.batching.split(",")]
    if args.marian:
        batchings = [False]
    searches = [s for s in ("greedy", "beam 4") if not args.only or s.startswith(args.only)]
    modes = [Mode(s, t, b) for b in batchings for s in searches for t in threads]
    load_start = os.getloadavg()
    print(f"torch {torch.__version__}, threads {threads}, {platform.machine()}, load {load_start}")
    results = {}
    with tempfile.TemporaryDirectory() as d:
        if args.marian:
            from .translate_marian import MarianSetup

            setup: Setup | MarianSetup = MarianSetup(steps, Path(d))
            srcs = make_sources(n, setup.vocab_size)
        else:
            setup, srcs = Setup(steps, Path(d)), make_sources(n, 8000)
        for mode in modes:
            torch.set_num_threads(mode.threads)
            systems = setup.systems(mode)
            load = os.getloadavg()
            secs, outs = time_systems(systems, srcs, repeats)
            results[mode.name] = report(mode, n, steps, secs, outs, load)
    print_ratios(results)
    if args.json:
        meta = {"torch": torch.__version__, "threads": threads, "sentences": n, "out_len": steps}
        meta |= {"batch": 32, "budget_tokens": BUDGET, "repeats": repeats}
        meta |= {"machine": platform.machine(), "load_average_at_start": load_start}
        meta |= {"model": "marian (benchmarks.translate_marian)" if args.marian else "qkv"}
        meta |= {"torch_config": _torch_config()}
        meta |= {"load_average_at_end": os.getloadavg()}
        Path(args.json).write_text(json.dumps(meta | {"results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
