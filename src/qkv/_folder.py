"""What a model folder holds: the name of every file qkv writes into one, and what makes a
folder one.

A model folder is what ``qkv train`` writes as a checkpoint (``OUT/checkpoints/step-N``) or a
final model (``OUT/final``), what ``qkv average`` and :func:`qkv.inference.save_model` write, and
what ``qkv export`` writes for another engine. Inside it::

    manifest.json       format, version, step, and the size and SHA-256 of every other file
    model.safetensors   the weights                                           (WEIGHTS)
    model.json          the qkv.nn.Seq2SeqConfig, tied-weight aliases, languages (MODEL_CONFIG)
    train.json          the qkv.train.TrainConfig of the run                  (TRAIN_CONFIG)
    split.json          which pairs are train / valid / test                  (SPLIT)
    trainer.json        step, data position, best BLEU, history, verdict      (TRAINER_STATE)
    trainer.pt          optimizer, schedule and RNG state (tensors only)      (TRAINER_TENSORS)
    decoding.json       the default decoding                                  (DECODING)
    tokenizers/         the source and target tokenizers                      (TOKENIZERS)
    README.md, card.json the model card, as text and as data                  (CARD, CARD_DATA)
    ctranslate2/        a CTranslate2 model (its model.bin)                   (CT2_DIR)
    encoder.onnx, decoder_step.onnx, onnx.json   ONNX graphs                  (ONNX_FILES)

A Hugging Face export (``qkv export --format huggingface``) holds ``transformers``' files
instead, beside its manifest: ``config.json``, ``generation_config.json``, the weights and the
card under the names above, and MarianTokenizer's ``source.spm``, ``target.spm``,
``vocab.json`` (``target_vocab.json``) and ``tokenizer_config.json`` (:data:`HF_FILES`).

A prepared corpus (:mod:`qkv.data.prepared`) has a :data:`MANIFEST` of that name too. Which
files a folder of each kind holds, and how they are verified, is :mod:`qkv.inference.saved`'s
(reading) and :mod:`qkv.inference.writing`'s (writing); the names are spelled here only. The
names of a *run* folder around model folders (``checkpoints/``, ``final/``, ``best.json``,
``.lock``) are :mod:`qkv.inference.layout`'s.

This module imports nothing (floor 0).
"""

from __future__ import annotations

__all__ = [
    "CARD",
    "CARD_DATA",
    "CT2_DIR",
    "CT2_OPTIONS",
    "CT2_WEIGHTS",
    "DECODING",
    "FOLDER_NAMES",
    "HF_CONFIG",
    "HF_FILES",
    "HF_GENERATION",
    "HF_SOURCE_SPM",
    "HF_TARGET_SPM",
    "HF_TARGET_VOCAB",
    "HF_TOKENIZER_CONFIG",
    "HF_VOCAB",
    "MANIFEST",
    "MODEL_CONFIG",
    "MODEL_MARKS",
    "ONNX_CONFIG",
    "ONNX_FILES",
    "RESUME_FILES",
    "SPLIT",
    "TOKENIZERS",
    "TRAINER_STATE",
    "TRAINER_TENSORS",
    "TRAIN_CONFIG",
    "UNFINISHED_MARKS",
    "WEIGHTS",
]

#: what the folder is and the size and SHA-256 of every other file; written last
MANIFEST = "manifest.json"
#: the weights (safetensors)
WEIGHTS = "model.safetensors"
#: the model's config (``Seq2SeqConfig.to_dict()``), tied-weight aliases and languages
MODEL_CONFIG = "model.json"
#: the run's ``TrainConfig``
TRAIN_CONFIG = "train.json"
#: which pairs are train / valid / test
SPLIT = "split.json"
#: the loop's state (JSON): step, data position, best BLEU, history; the final model's source
TRAINER_STATE = "trainer.json"
#: a checkpoint's optimizer, schedule and RNG state (tensors only)
TRAINER_TENSORS = "trainer.pt"
#: the default decoding (``Decoding.to_dict()``)
DECODING = "decoding.json"
#: the folder of the source and target tokenizers
TOKENIZERS = "tokenizers"
#: the model card (Markdown) and its content as data
CARD, CARD_DATA = "README.md", "card.json"
#: the CTranslate2 model's folder inside an exported model folder, CTranslate2's weights, and
#: qkv's settings beside them (languages, decoding, position bounds)
CT2_DIR, CT2_WEIGHTS, CT2_OPTIONS = "ctranslate2", "model.bin", "qkv.json"
#: the ONNX graphs and their settings (``qkv export --format onnx``)
ONNX_CONFIG = "onnx.json"
ONNX_FILES: tuple[str, ...] = ("encoder.onnx", "decoder_step.onnx", ONNX_CONFIG)
#: a Hugging Face folder's model config and generation config (``transformers``' names)
HF_CONFIG, HF_GENERATION = "config.json", "generation_config.json"
#: MarianTokenizer's files: the SentencePiece models of each side, the vocabulary (the
#: target's own with separate vocabularies) and the tokenizer's config
HF_SOURCE_SPM, HF_TARGET_SPM = "source.spm", "target.spm"
HF_VOCAB, HF_TARGET_VOCAB = "vocab.json", "target_vocab.json"
HF_TOKENIZER_CONFIG = "tokenizer_config.json"
HF_FILES: tuple[str, ...] = (
    HF_CONFIG,
    HF_GENERATION,
    HF_SOURCE_SPM,
    HF_TARGET_SPM,
    HF_VOCAB,
    HF_TARGET_VOCAB,
    HF_TOKENIZER_CONFIG,
)

#: every name a folder qkv writes may hold (a temporary folder a killed writer left is removed
#: only when it holds no other)
FOLDER_NAMES = frozenset(
    {
        MANIFEST,
        WEIGHTS,
        MODEL_CONFIG,
        TRAIN_CONFIG,
        SPLIT,
        TRAINER_STATE,
        TRAINER_TENSORS,
        DECODING,
        TOKENIZERS,
        CARD,
        CARD_DATA,
        CT2_DIR,
        *ONNX_FILES,
        *HF_FILES,
    }
)
#: what resuming a run reads of a checkpoint (each listed in its manifest)
RESUME_FILES = (
    MODEL_CONFIG,
    WEIGHTS,
    TRAIN_CONFIG,
    SPLIT,
    TRAINER_STATE,
    TRAINER_TENSORS,
    TOKENIZERS,
)
#: the files a qkv model folder has besides its manifest: one of them without the manifest
#: (written last) is a folder whose writing never completed
UNFINISHED_MARKS = (WEIGHTS, TRAINER_TENSORS, MODEL_CONFIG)
#: what makes a folder a model of some engine: qkv's manifest or files, ONNX graphs, a
#: CTranslate2 model (its own, or inside a qkv export)
MODEL_MARKS = (MANIFEST, MODEL_CONFIG, WEIGHTS, ONNX_CONFIG, CT2_WEIGHTS, CT2_DIR)
