"""The automatic preset's tiers: a model shape, batch and peak learning rate for each budget
and device (:data:`TIERS`), chosen by :func:`qkv.train.presets.choose_preset`.

A table with nothing to import but typing: :mod:`qkv.train.config` checks a preset's name against
it, and the speed probe (:mod:`qkv.train.speed`, which the preset imports) times the run's own
update (:mod:`qkv.train.update`, which imports the config).
"""

from __future__ import annotations

from typing import Any

__all__ = ["TIERS", "transformer_shape"]


def transformer_shape(
    width: int, ffn: int, heads: int, layers: int, dec_layers: int | None = None
) -> dict[str, Any]:
    """The options of a pre-norm ReLU Transformer of ``layers`` encoder layers and
    ``dec_layers`` decoder ones (None: as many) (:class:`qkv.nn.seq2seq.Seq2SeqConfig`'s names)."""
    return {
        "num_hiddens": width,
        "ffn_num_hiddens": ffn,
        "num_heads": heads,
        "num_enc_layers": layers,
        "num_dec_layers": layers if dec_layers is None else dec_layers,
        "norm_first": True,
        "activation": "relu",
    }


#: name -> (device, budget bound (minutes on that device, inclusive), model, max_tokens, lr),
#: smallest first on each device (the first whose bound holds a budget is chosen);
#: the model's dropout comes from :func:`~qkv.train.presets.dropout_for` (the epochs the budget allows). A bound is
#: in minutes of the reference machine (``qkv.train.presets._TOKENS_PER_SECOND``); a CPU run whose speed was
#: measured (:mod:`qkv.train.speed`) counts its budget in those minutes: a machine half as fast
#: gets the tier of half the budget
#: (cpu-micro, cpu-tiny and cpu-small: a shallow decoder (Kasai et al. 2021) and a small
#: vocabulary (:data:`~qkv.train.presets.VOCAB_CAPS`) for runs of few updates, Sennrich & Zhang 2019. cpu-tiny, a
#: quarter of cpu-small's cost per token, measured on benchmarks/real.py's English-German: 12.5
#: BLEU in 3 quiet minutes (cpu-small 2.9), 16.4 in 5 (cpu-small 10.7), 4.5 in 3 minutes beside
#: two busy processes (cpu-small 1.0); cpu-small, of the same bound, takes the budgets that would
#: show a small corpus to cpu-tiny more than :data:`~qkv.train.presets.MAX_EPOCHS` times. cpu-micro, one encoder
#: layer and 256-token batches, makes 1.6-2.4 times cpu-tiny's updates: beside two busy
#: processes in 3 minutes (about 0.85 reference minutes) English-German 7.3 and 5.4 BLEU in two
#: runs against cpu-tiny's 4.5-5.0, English-French 16.5 against 10.3-10.5, English-Chinese 12.6
#: against 4.8; in 3 quiet minutes it lost, 11.5 against 12.5: its bound lies between, on a log
#: scale. cpu-minutes up to 25: benchmarks/real.py's 10 minutes, scaled to 7.6-8.4 on a machine
#: 1.2-1.3 times the reference's (GEMM 201-222) and trained in bfloat16, counted 17.8-20.8
#: reference minutes, and there cpu-minutes scored 41.93 and 43.43 test BLEU on
#: English-French (then 42.52 at 20.8 with this bound) where cpu-hour scored 40.72, 34.68 and
#: 33.89 on English-German where cpu-hour scored 34.31 (one cpu-hour run each, within a run's
#: spread: no worse); cpu-hour keeps the 30-minute rows, 30 reference minutes in float32 and
#: 52.1 here: 25 lies between, on a log scale)
TIERS: dict[str, tuple[str, float, dict[str, Any], int, float]] = {
    "cpu-micro": ("cpu", 1.5, transformer_shape(128, 512, 4, 1), 256, 2e-3),
    "cpu-tiny": ("cpu", 5.0, transformer_shape(128, 512, 4, 2, dec_layers=1), 512, 3e-3),
    "cpu-small": ("cpu", 5.0, transformer_shape(256, 1024, 4, 2, dec_layers=1), 512, 2e-3),
    "cpu-minutes": ("cpu", 25.0, transformer_shape(256, 1024, 4, 2), 512, 1.5e-3),
    "cpu-hour": ("cpu", 120.0, transformer_shape(256, 1024, 4, 3), 1024, 1.5e-3),
    "cpu-long": ("cpu", float("inf"), transformer_shape(512, 2048, 8, 6), 4096, 7e-4),
    "gpu-short": ("cuda", 60.0, transformer_shape(512, 2048, 8, 6), 8192, 1e-3),
    "gpu-base": ("cuda", float("inf"), transformer_shape(512, 2048, 8, 6), 16384, 7e-4),
}
