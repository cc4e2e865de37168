"""Small MarianMTModel folders made by transformers itself, laid out as OPUS-MT's.

Each folder holds what ``save_pretrained`` writes (``config.json``, ``generation_config.json``,
``model.safetensors``) and MarianTokenizer's files (``source.spm``, ``target.spm``,
``vocab.json``, with ``separate_vocabs`` a ``target_vocab.json`` too,
``tokenizer_config.json``). The SentencePiece models are trained on the spot (unigram,
SentencePiece's own ``nmt_nfkc`` normalisation, as OPUS-MT's) on pairs of the bundled corpus,
and each model is trained briefly with transformers' own forward pass and loss, so that it ends
its sentences and a beam has real choices to make. No network.
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence

from qkv.data import bundled_pairs


@dataclass(frozen=True)
class Kind:
    """One MarianMTModel configuration."""

    activation: str = "swish"
    share: bool = True  # share_encoder_decoder_embeddings
    tie: bool = True  # tie_word_embeddings
    separate_vocabs: bool = False
    multi_target: bool = False
    scale_embedding: bool = True


#: four configurations that between them hold every feature the importer maps: the three
#: activations, an output layer of its own, separate encoder and decoder embeddings, separate
#: vocabularies, unscaled embeddings, a multi-target model (tests/interop/
#: test_interop_marian_table.py checks the tensor map of more combinations, untrained)
KINDS = {
    "swish-tied": Kind(),
    "relu-untied-separate": Kind(activation="relu", share=False, tie=False),
    "swish-multi": Kind(multi_target=True),
    "gelu-noscale-vocabs": Kind(
        activation="gelu", share=False, separate_vocabs=True, scale_embedding=False
    ),
}

MAX_LENGTH = 40  # generation_config.json's max_length (OPUS-MT: 512)


def corpus(n_train: int = 600, n_test: int = 80, seed: int = 0):
    """``(train pairs, test pairs)`` from the bundled English-French corpus, with capitals and
    punctuation put back the way people write (the corpus is lower-cased and spaced)."""
    rows = bundled_pairs()
    rng = random.Random(seed)
    rows = rng.sample(rows, n_train + n_test)

    def written(text: str) -> str:
        text = text.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",")
        return text[:1].upper() + text[1:]

    rows = [(written(s), written(t)) for s, t in rows]
    return rows[:n_train], rows[n_train:]


def second_target(text: str) -> str:
    """A made-up second target language for the multi-target model: the words reversed."""
    return " ".join(reversed(text.split()))


def _spm(texts: list[str], size: int) -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buf,
        vocab_size=size,
        model_type="unigram",
        hard_vocab_limit=False,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )  # Marian's: <unk>=0 <s>=1 </s>=2, nmt_nfkc
    return buf.getvalue()


def _pieces(model: bytes) -> list[str]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def _opus_vocab(*piece_lists: list[str], codes=(), pad_first: bool = False) -> dict[str, int]:
    """OPUS-MT's vocab.json: ``</s>``=0, ``<unk>``=1, the language tokens, every model's
    pieces (first seen first), ``<pad>`` last (``pad_first``: at 2, so that two separate
    vocabularies put it at one id, as Marian's one pad_token_id needs)."""
    vocab = {"</s>": 0, "<unk>": 1}
    if pad_first:
        vocab["<pad>"] = 2
    for t in codes:
        vocab.setdefault(t, len(vocab))
    for pieces in piece_lists:
        for p in pieces:
            if p not in ("<s>", "</s>", "<unk>"):
                vocab.setdefault(p, len(vocab))
    vocab.setdefault("<pad>", len(vocab))
    return vocab


def build_marian(
    out: Path, name: str, *, steps: int = 150, seed: int = 0, batch: int = 24
) -> tuple[Path, list[str]]:
    """A trained MarianMTModel folder of configuration ``KINDS[name]`` in ``out/name``, and its
    test sources (a multi-target model's start with ``>>fra<<`` or ``>>deu<<``).

    The model trains ``steps`` updates of ``batch`` pairs without dropout (its ``config.json``
    then says OPUS-MT's 0.1; it gets sharp sooner), with torch's fused AdamW: the four kinds
    build in 30 s where batches of 32 and the unfused AdamW took 43 (one thread). Their
    greedy translations of the 80 test sources are 58-75 distinct per kind, and at most 2 of
    80 per kind are decided by a near-tie (:func:`searched`), which a test leaves out: at
    which sentences such ties fall is a seed's and a CPU's luck (seed 0 had none in greedy
    steps with batches of 32, seeds 1-5 had gaps down to 5e-5)."""
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    k = KINDS[name]
    train, test = corpus(seed=seed)
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    codes = [">>fra<<", ">>deu<<"] if k.multi_target else []
    if k.multi_target:
        pairs = [(f">>fra<< {s}", t) for s, t in train]
        pairs += [(f">>deu<< {s}", second_target(t)) for s, t in train]
    else:
        pairs = list(train)
    src_model = _spm([s for s, _ in train], 300)
    tgt_model = _spm([t for _, t in pairs], 400)
    (folder / "source.spm").write_bytes(src_model)
    (folder / "target.spm").write_bytes(tgt_model)
    if k.separate_vocabs:
        vocab = _opus_vocab(_pieces(src_model), pad_first=True)
        tvocab = _opus_vocab(_pieces(tgt_model), pad_first=True)
        (folder / "target_vocab.json").write_text(json.dumps(tvocab, ensure_ascii=False))
    else:
        vocab = tvocab = _opus_vocab(_pieces(src_model), _pieces(tgt_model), codes=codes)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    extra = {"target_vocab_file": str(folder / "target_vocab.json")} if k.separate_vocabs else {}
    tok = MarianTokenizer(
        str(folder / "source.spm"),
        str(folder / "target.spm"),
        str(folder / "vocab.json"),
        source_lang="en",
        target_lang="fr",
        separate_vocabs=k.separate_vocabs,
        **extra,
    )
    pad = tvocab["<pad>"]
    config = MarianConfig(
        vocab_size=len(vocab),
        decoder_vocab_size=len(tvocab),
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        activation_function=k.activation,
        max_position_embeddings=256,
        scale_embedding=k.scale_embedding,
        share_encoder_decoder_embeddings=k.share,
        tie_word_embeddings=k.tie,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        dropout=0.0,  # while it trains; saved as 0.1 below
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed + len(name))
        model = MarianMTModel(config)
        with torch.no_grad():  # a final_logits_bias that matters, norms that are not 1 and 0
            model.final_logits_bias.normal_(0, 0.5)
            for n, p in model.named_parameters():
                if "layer_norm" in n:
                    p.add_(torch.randn_like(p) * 0.1)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
        model.train()
        rng = random.Random(seed)
        # each pair tokenized once (the tokenizer is Python: a tenth of the training's time),
        # a batch padded as ``tok(sources, text_target=targets, padding=True)`` pads it
        ids = [(tok(s)["input_ids"], tok(text_target=t)["input_ids"]) for s, t in pairs]
        for _ in range(steps):
            rows = rng.sample(ids, batch)
            source = pad_sequence([torch.tensor(s) for s, _ in rows], True, pad)
            labels = pad_sequence([torch.tensor(t) for _, t in rows], True, -100)
            mask = (source != pad).long()  # a source's pieces are never <pad>
            loss = model(input_ids=source, attention_mask=mask, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    model.config.dropout = 0.1  # OPUS-MT's
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad]],
        bos_token_id=0,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        max_length=MAX_LENGTH,
        num_beams=4,
        pad_token_id=pad,
    )  # OPUS-MT's generation_config.json, with a short max_length
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "README.md").write_text(
        "---\nlanguage:\n- en\n- fr\nlicense: cc-by-4.0\ntags:\n- translation\n---\n\n# test\n"
    )
    sources = [s for s, _ in test]
    if k.multi_target:
        sources = [f">>{'fra' if i % 2 else 'deu'}<< {s}" for i, s in enumerate(sources)]
    return folder, sources


def load_exported(folder: Path):
    """A folder qkv exported for transformers, as a user loads it: ``(model in evaluation
    mode, tokenizer)``, with no missing, unexpected or mismatched weight (asserted)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model, info = AutoModelForSeq2SeqLM.from_pretrained(folder, output_loading_info=True)
    assert not any(info.values()), info
    return model.eval(), AutoTokenizer.from_pretrained(folder)


def generated_ids(model, rows) -> list[list[int]]:
    """``model.generate``'s rows as qkv's token ids: without the decoder's start token, the
    ``<pad>`` of a padded batch and what follows ``<eos>``."""
    cfg = model.generation_config
    out = []
    for row in rows.tolist():
        ids = []
        for t in row[1:]:
            if t == cfg.eos_token_id:
                break
            if t != cfg.pad_token_id:
                ids.append(t)
        out.append(ids)
    return out


#: the least gap between two candidates that qkv and transformers (or CTranslate2) are asked to
#: break alike. For a greedy step it is a bound: twice the 1e-4 their logits may differ by (the
#: test asserts it; they differ by about 1e-6). For a beam's final scores (sums of a
#: translation's log-probabilities over a power of its length) it is a margin, not a bound:
#: there the same 1e-6 differences add up over the steps. A nearer tie is broken by float
#: rounding, which another CPU, another library's order of the same sums or another
#: optimizer's rounding of the weights changes: the brief trainings leave gaps of 1e-6 to
#: 1e-5 in a few of 80 sentences, on a seed's luck
NEAR_TIE = 2e-4


def searched(model, enc, **options) -> tuple[list[list[int]], list[bool]]:
    """``model.generate(**enc, **options)``'s translations (:func:`generated_ids`), and for
    each whether the search decides it by more than :data:`NEAR_TIE`: greedy
    (``num_beams=1``), every step of the row's search (the two best tokens of each of its
    steps up to its ``<eos>``); a beam, the scores of its two best finished translations (a
    nearer tie among the candidates a step keeps is not seen)."""
    beams = options.get("num_beams", model.generation_config.num_beams)
    kept = {"output_scores": True, "return_dict_in_generate": True}
    with torch.no_grad():
        if beams > 1:  # the same search, its two best translations returned
            out = model.generate(**enc, **options, num_return_sequences=2, **kept)
            best = out.sequences_scores.view(-1, 2)
            keep = ((best[:, 0] - best[:, 1]).abs() > NEAR_TIE).tolist()
            return generated_ids(model, out.sequences[::2]), keep
        out = model.generate(**enc, **options, **kept)
    eos = model.generation_config.eos_token_id
    keep = []
    for b in range(out.sequences.shape[0]):
        gaps = []
        for t, scores in enumerate(out.scores):
            top = scores[b].topk(2).values
            gaps.append((top[0] - top[1]).item())
            if out.sequences[b, t + 1].item() == eos:
                break
        keep.append(min(gaps) > NEAR_TIE)
    return generated_ids(model, out.sequences), keep


def where(keep: list[bool], items: list) -> list:
    """The ``items`` whose ``keep`` is true."""
    return [x for k, x in zip(keep, items, strict=True) if k]
