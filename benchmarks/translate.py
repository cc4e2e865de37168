"""Translation speed side by side: qkv, a plain PyTorch loop, CTranslate2 and Hugging Face.

Issue 14's shape, one model decoded by every system in one process run: a post-norm Transformer
256 wide, 3+3 layers, 4 heads, FFN 1024, a shared 8k vocabulary, random weights with the EOS
logit pushed down so that every system decodes the same forced output length; 1,000 random
sources of 5 to 30 tokens, sorted by length, in batches of 32, at 2 threads. Greedy and beam 4:

* **qkv fp32**: :func:`qkv.decoding.generate` (what ``qkv translate`` runs per batch);
* **qkv int8**: the same on :func:`qkv.inference.quantize_model` (``--quantize int8``);
* **plain loop**: a plain PyTorch encoder and decoder over the same weights with a KV cache
  (``torch.cat``) and ``scaled_dot_product_attention``, no checks: the honest baseline;
* **ct2 fp32 / ct2 int8**: CTranslate2 on the model :func:`qkv.export.ctranslate2.to_spec`
  converts (skipped with a note when ctranslate2 or that module is missing);
* **HF generate**: Hugging Face ``MarianMTModel.generate`` on a ``MarianConfig`` of the same
  shape with the same weights (no download; skipped with a note without ``transformers``).

Each round runs every system once over all the sentences, in a rotated order; the table gives
the median seconds (after a warm-up on 64 sentences), sentences/s and target tokens/s, how many outputs equal qkv fp32's, and last
the ratios the issue asks for (> 1: qkv faster): qkv fp32 >= the plain loop and >= 0.85x
CTranslate2 fp32, qkv int8 >= 0.5x CTranslate2 int8.

Run: ``python -m benchmarks.translate [--quick] [--repeats N] [--json PATH] [--sentences N]
[--out-len T] [--threads N] [--only greedy|beam]``.
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
from qkv.inference import quantize_model
from qkv.nn.position import sinusoidal_encoding
from qkv.nn.seq2seq import build_model

PAD, BOS, EOS = 0, 1, 2
Batches = list[tuple[Tensor, Tensor]]


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
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(5, 31, (n,), generator=g)
    srcs = [torch.randint(4, vocab, (int(L),), generator=g).tolist() for L in lens]
    return sorted(srcs, key=len)


def make_batches(srcs: list[list[int]], size: int = 32) -> Batches:
    out = []
    for i in range(0, len(srcs), size):
        rows = [[*s, EOS] for s in srcs[i : i + size]]
        src = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
        for r, ids in enumerate(rows):
            src[r, : len(ids)] = torch.tensor(ids)
        out.append((src, torch.tensor([len(r) for r in rows])))
    return out


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
def ct2_systems(model, srcs, steps, beam, threads, folder: Path) -> dict[str, Callable]:
    """CTranslate2 fp32 and int8 on the converted model, or {} (a note printed)."""
    try:
        import ctranslate2

        from qkv.export.ctranslate2 import to_spec
    except ImportError as e:
        print(f"note: CTranslate2 rows skipped ({e})")
        return {}
    vocab = ["<pad>", "<bos>", "<eos>", "<unk>"]
    vocab += [f"w{i}" for i in range(4, model.config.tgt_vocab_size)]
    spec = to_spec(model)
    spec.register_source_vocabulary(vocab)
    spec.register_target_vocabulary(vocab)
    spec.validate()
    spec.optimize(quantization=None)
    folder.mkdir(parents=True)
    spec.save(str(folder))
    index = {t: i for i, t in enumerate(vocab)}
    tokens = [[vocab[i] for i in s] for s in srcs]

    def system(compute_type: str) -> Callable:
        tr = ctranslate2.Translator(
            str(folder), compute_type=compute_type, inter_threads=1, intra_threads=threads
        )

        def run() -> list[list[int]]:
            res = tr.translate_batch(
                tokens,
                max_batch_size=32,
                beam_size=beam,
                max_decoding_length=steps,
                min_decoding_length=0,
                max_input_length=0,
                suppress_sequences=[["<pad>"], ["<bos>"]],
            )
            return [[index[t] for t in r.hypotheses[0]] for r in res]

        return run

    return {"ct2 fp32": system("float32"), "ct2 int8": system("int8")}


def engine_system(model, srcs, steps, beam, threads, folder: Path) -> dict[str, Callable]:
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

    tok = WordTokenizer(Vocab(f"w{i}" for i in range(4, model.config.tgt_vocab_size)))
    save_model(model, tok, tok, folder / "saved")
    export_ctranslate2(folder / "saved", folder / "exported")
    ct2 = Ct2Translator(folder / "exported", threads=threads)
    texts = [" ".join(f"w{i}" for i in s) for s in srcs]
    return {"qkv engine ct2": lambda: ct2.generate(texts, beam_size=beam, max_output_len=steps)}


# ---------------------------------------------------------------------------- Hugging Face
def hf_system(model, batches: Batches, steps: int, beam: int) -> dict[str, Callable]:
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
    def run() -> list[list[int]]:
        out = []
        for src, lens in batches:
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
def systems_for(model, srcs, steps, beam, threads, folder) -> dict[str, Callable]:
    batches = make_batches(srcs)
    int8, plain = quantize_model(model), PlainLoop(model)

    def qkv(m) -> Callable:
        def run() -> list[list[int]]:
            out = []
            for src, lens in batches:
                out += generate(m, src, lens, max_len=steps, bos_id=BOS, eos_id=EOS, beam_size=beam)
            return out

        return run

    systems = {"qkv fp32": qkv(model), "qkv int8": qkv(int8)}
    systems["plain loop"] = lambda: [r for s, v in batches for r in plain.search(s, v, steps, beam)]
    systems.update(ct2_systems(model, srcs, steps, beam, threads, folder / "ct2"))
    systems.update(engine_system(model, srcs, steps, beam, threads, folder / "engine"))
    systems.update(hf_system(model, batches, steps, beam))
    return systems


def time_systems(
    systems: dict[str, Callable], warm: dict[str, Callable], repeats: int
) -> tuple[dict, dict]:
    """Seconds per system over ``repeats`` rounds in rotated order (after one call of each of
    ``warm``, the same systems on a few sentences), and each system's first outputs."""
    names, outs = list(systems), {}
    for name in names:
        warm[name]()
    secs: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            out = systems[name]()
            secs[name].append(time.perf_counter() - t0)
            outs.setdefault(name, out)
    return secs, outs


RATIOS = (  # (name, faster system, slower system, target)
    ("qkv fp32 vs plain loop", "qkv fp32", "plain loop", 1.0),
    ("qkv fp32 vs ct2 fp32", "qkv fp32", "ct2 fp32", 0.85),
    ("qkv int8 vs ct2 int8", "qkv int8", "ct2 int8", 0.5),
    ("qkv --engine ctranslate2 vs ct2 fp32", "qkv engine ct2", "ct2 fp32", 0.9),
    ("qkv fp32 vs HF generate", "qkv fp32", "HF generate", None),
)


def report(search: str, n: int, steps: int, secs: dict, outs: dict) -> dict:
    ref = outs["qkv fp32"]
    rows = {}
    print(f"\n{search}: {n} sentences, {steps} target tokens each, batch 32")
    print(f"{'system':<15} {'median s':>9} {'sent/s':>8} {'tok/s':>8}  same as qkv fp32")
    for name, s in secs.items():
        med = statistics.median(s)
        same = sum(a == b for a, b in zip(ref, outs[name]))
        rows[name] = {"median_s": med, "samples_s": s, "sentences_per_s": n / med}
        rows[name] |= {"tokens_per_s": n * steps / med, "same_as_qkv_fp32": same}
        print(f"{name:<15} {med:>9.3f} {n / med:>8.1f} {n * steps / med:>8.0f}  {same}/{n}")
    ratios = []
    for label, a, b, target in RATIOS:
        if a in rows and b in rows:
            r = rows[b]["median_s"] / rows[a]["median_s"]
            ok = "" if target is None else ("  ok" if r >= target else "  MISSED")
            tgt = "" if target is None else f" (target >= {target:g}x)"
            print(f"{label}: {r:.2f}x{tgt}{ok}")
            ratios.append({"case": label, "ratio": r, "target": target})
    return {"systems": rows, "ratios": ratios}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (median)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--quick", action="store_true", help="64 sentences, 16 tokens, 1 round")
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--out-len", type=int, default=64, help="forced target tokens per sentence")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", choices=("greedy", "beam"))
    args = p.parse_args(argv)
    n, steps, repeats = args.sentences, args.out_len, args.repeats
    if args.quick:
        n, steps, repeats = 64, 16, 1
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
    model = make_model()
    srcs = make_sources(n, model.config.src_vocab_size)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}")
    results = {}
    with tempfile.TemporaryDirectory() as d:
        for search, beam in (("greedy", 1), ("beam 4", 4)):
            if args.only and not search.startswith(args.only):
                continue
            folder = Path(d) / search
            systems = systems_for(model, srcs, steps, beam, args.threads, folder / "all")
            warm = systems_for(model, srcs[:64], steps, beam, args.threads, folder / "warm")
            secs, outs = time_systems(systems, warm, repeats)
            results[search] = report(search, n, steps, secs, outs)
    if args.json:
        meta = {"torch": torch.__version__, "threads": args.threads, "sentences": n}
        meta |= {"out_len": steps, "batch": 32, "repeats": repeats, "machine": platform.machine()}
        meta |= {"load_average_at_start": load_start, "load_average_at_end": os.getloadavg()}
        Path(args.json).write_text(json.dumps(meta | {"results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
