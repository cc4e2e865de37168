"""The Marian rows of :mod:`benchmarks.translate`: CTranslate2 on its home ground.

An OPUS-MT-sized ``MarianMTModel`` (6+6 layers, d_model 512, 8 heads, FFN 2048, swish, tied
embeddings, a 58,101-piece vocabulary with ``</s>`` 0 and ``<pad>`` last, as
``Helsinki-NLP/opus-mt-*``) is built by ``transformers`` with its own random initialisation
and ``final_logits_bias[</s>]`` pushed down (a forced output length), saved with
MarianTokenizer's files (a SentencePiece model trained on the bundled corpus, the vocabulary
filled up to OPUS-MT's size), then

* converted by CTranslate2's own converter (``ctranslate2.converters.TransformersConverter``,
  what ``ct2-transformers-converter --model DIR`` runs), fp32 and int8 at load time;
* imported by ``qkv import`` (:func:`qkv.interop.importer.import_model`) and decoded by
  :func:`qkv.decoding.generate` on the folder's model (fp32) and on
  :func:`qkv.inference.quantize_model` of it (int8).

Every system decodes the same batches of 32 random-id sources in input order (the ids given
to CTranslate2 as the vocabulary's pieces, ``</s>`` appended as MarianTokenizer does); the
table counts the outputs equal to qkv fp32's.

``python -m benchmarks.translate_marian [--threads N]`` (:func:`profile`) measures where the
time goes: torch's fp32 GEMM rate at the decode step's shapes, qkv's int8 decoding under each
of torch's quantized engines (x86, fbgemm, onednn), and a torch.profiler table of a greedy
decode. Measured on the AMD EPYC of README's rows (2 threads, load about 1.5): the attention
and FFN projections at 99-113 GFLOP/s, the 58,101-row vocabulary projection at 19.6 GFLOP/s
(120 MB of weights streamed at every step). CTranslate2 chooses its GEMM backend by CPU
vendor; forcing Intel MKL on this AMD CPU (``CT2_USE_MKL=1``) made its fp32 1.18x slower and
its int8 8.6x slower than its default (``python -m benchmarks.translate --marian --quick
--threads 2 --only greedy`` with ``CT2_USE_MKL=0`` and ``=1``); qkv's fp32 decode step already
runs its linear layers through oneDNN (``mkldnn::_linear_pointwise`` in the profile), and its
int8 ones through torch's x86/fbgemm engine (its onednn quantized engine measured 2.7x slower,
on a busy machine).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import torch

from qkv.decoding import generate
from qkv.inference import load_model, quantize_model

#: OPUS-MT's shape (Helsinki-NLP/opus-mt-en-de: 58,101 pieces)
VOCAB, WIDTH, HEADS, FFN, LAYERS = 58101, 512, 8, 2048, 6
EOS, UNK, PAD = 0, 1, VOCAB - 1
#: the fewest source ids a random source draws from (past </s> and <unk>)
FIRST = 2


def _spm(texts: list[str]) -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=buf, vocab_size=500, hard_vocab_limit=False, model_type="unigram",
        unk_id=1, bos_id=-1, eos_id=0, pad_id=-1, unk_piece="<unk>", eos_piece="</s>",
        minloglevel=2,
    )  # fmt: skip
    return buf.getvalue()


def build_marian_folder(folder: Path) -> Path:
    """The OPUS-MT-sized MarianMTModel folder (see the module docstring) in ``folder``."""
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    from qkv.data import bundled_pairs

    folder.mkdir(parents=True)
    model = _spm([t for pair in bundled_pairs()[:20000] for t in pair])
    (folder / "source.spm").write_bytes(model)
    (folder / "target.spm").write_bytes(model)
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    vocab = {"</s>": EOS, "<unk>": UNK}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    for i in range(len(vocab), PAD):
        vocab[f"▁w{i}"] = i
    vocab["<pad>"] = PAD
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    tok = MarianTokenizer(
        str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"),
        source_lang="en", target_lang="de",
    )  # fmt: skip
    config = MarianConfig(
        vocab_size=VOCAB, decoder_vocab_size=VOCAB, d_model=WIDTH, encoder_layers=LAYERS,
        decoder_layers=LAYERS, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
        encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, activation_function="swish",
        max_position_embeddings=512, scale_embedding=True, pad_token_id=PAD, eos_token_id=EOS,
        decoder_start_token_id=PAD, forced_eos_token_id=EOS, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = MarianMTModel(config).eval()
    with torch.no_grad():
        hf.final_logits_bias[0, EOS] = -1e4  # never stops early: a forced output length
    hf.generation_config = GenerationConfig(
        bad_words_ids=[[PAD]], decoder_start_token_id=PAD, eos_token_id=EOS,
        forced_eos_token_id=EOS, max_length=512, num_beams=4, pad_token_id=PAD,
    )  # fmt: skip
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


class MarianSetup:
    """The Marian folder, its CTranslate2 conversion and its qkv import (fp32 and int8),
    made once for every mode of :mod:`benchmarks.translate`."""

    def __init__(self, steps: int, folder: Path) -> None:
        import ctranslate2
        from ctranslate2.converters import TransformersConverter

        from qkv.interop.importer import import_model

        self.steps, self.folder = steps, folder
        hf = build_marian_folder(folder / "marian")
        TransformersConverter(str(hf)).convert(str(folder / "ct2"), quantization=None)
        imported = import_model(hf, folder / "qkv")
        self.model = load_model(imported.path).model.eval()
        self.int8 = quantize_model(self.model)
        self.vocab = json.loads((hf / "vocab.json").read_text())
        self.pieces = {i: p for p, i in self.vocab.items()}
        self.ctranslate2 = ctranslate2
        self.vocab_size = VOCAB - 1  # the ids a source draws from: below <pad>

    def batches(self, srcs: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Batches of 32 in input order, ``</s>`` appended, padded with ``<pad>``."""
        out = []
        for i in range(0, len(srcs), 32):
            rows = [[*s, EOS] for s in srcs[i : i + 32]]
            src = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
            for r, ids in enumerate(rows):
                src[r, : len(ids)] = torch.tensor(ids)
            out.append((src, torch.tensor([len(r) for r in rows])))
        return out

    def systems(self, mode) -> dict:
        """qkv fp32/int8 and CTranslate2 fp32/int8 for ``mode`` (batch 32 in input order)."""
        steps, beam = self.steps, mode.beam

        def qkv(m):
            def run(srcs):
                out = []
                for src, lens in self.batches(srcs):
                    out += generate(
                        m, src, lens, max_output_len=steps, bos_id=PAD, eos_id=EOS, pad_id=PAD,
                        beam_size=beam, suppress=(PAD,),
                    )  # fmt: skip
                return out

            return run

        def ct2(compute_type: str):
            tr = self.ctranslate2.Translator(
                str(self.folder / "ct2"), compute_type=compute_type, inter_threads=1,
                intra_threads=mode.threads,
            )  # fmt: skip

            def run(srcs):
                tokens = [[self.pieces[i] for i in s] + ["</s>"] for s in srcs]
                out = []
                for i in range(0, len(tokens), 32):
                    res = tr.translate_batch(
                        tokens[i : i + 32],
                        beam_size=beam,
                        max_decoding_length=steps,
                        min_decoding_length=0,
                        max_input_length=0,
                    )  # fmt: skip (its converter drops <pad>: never generated)
                    out += [[self.vocab[t] for t in r.hypotheses[0]] for r in res]
                return out

            return run

        return {
            "qkv fp32": qkv(self.model),
            "qkv int8": qkv(self.int8),
            "ct2 fp32": ct2("float32"),
            "ct2 int8": ct2("int8"),
        }


def profile(threads: int = 2, steps: int = 16, n: int = 64) -> None:
    """Where qkv's decoding of the Marian model spends its time (torch.profiler, greedy, batch
    32, fp32 and int8), and the fp32 GEMM rate of the decode step's shapes (32 rows: the
    attention and FFN projections, the 58,101-row vocabulary projection) with torch's BLAS."""
    import tempfile
    import time

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from .translate import make_sources

    torch.set_num_threads(threads)
    print(
        f"torch {torch.__version__}, {threads} threads, {torch.backends.cpu.get_cpu_capability()}"
    )
    for rows, k, m in ((32, 512, 512), (32, 512, 2048), (32, 2048, 512), (32, 512, VOCAB)):
        x, w = torch.randn(rows, k), torch.randn(m, k)
        torch.nn.functional.linear(x, w)
        best = float("inf")
        for _ in range(20):
            t = time.perf_counter()
            torch.nn.functional.linear(x, w)
            best = min(best, time.perf_counter() - t)
        print(f"linear {rows}x{k} @ {k}x{m}: {2 * rows * k * m / best / 1e9:.1f} GFLOP/s")
    with tempfile.TemporaryDirectory() as d:
        setup = MarianSetup(steps, Path(d))
        srcs = make_sources(n, setup.vocab_size)

        from .translate import Mode

        mode = Mode("greedy", threads, own_batching=False)
        systems = setup.systems(mode)
        default = torch.backends.quantized.engine
        for engine in ("x86", "fbgemm", "onednn"):  # torch's int8 GEMM backends
            torch.backends.quantized.engine = engine
            setup.int8 = quantize_model(setup.model)
            run = setup.systems(mode)["qkv int8"]
            run(srcs[:32])
            times = []
            for _ in range(3):
                t = time.perf_counter()
                run(srcs)
                times.append(time.perf_counter() - t)
            print(f"qkv int8, quantized engine {engine}: {sorted(times)[1]:.3f} s (median of 3)")
        torch.backends.quantized.engine = default
        setup.int8 = quantize_model(setup.model)
        for name in ("qkv fp32", "qkv int8"):
            systems[name](srcs[:32])
            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                systems[name](srcs)
            print(f"\n{name}, greedy, {n} sentences, {steps} tokens")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="profile qkv's decoding of the Marian model")
    p.add_argument("--threads", type=int, default=2)
    profile(p.parse_args().threads)
