"""The decodings a trained run tries, and :class:`Decoding` under its public name.

:class:`Decoding`, the one value of every decoding option, lives beside the search that reads it
(:mod:`qkv.decoding.options`, floor 2); ``qkv.inference.Decoding`` is that class.
"""

from __future__ import annotations

from ..decoding.options import Decoding, default_max_len, default_output_len

__all__ = ["CANDIDATES", "Decoding", "default_max_len", "default_output_len"]

#: the decodings a trained run tries on its validation split before it saves its final model
#: (``qkv train``, ``tune_decoding``): greedy, and beam 4 with two length penalties. None repeats
#: a 3-gram of pieces: an undertrained model's loops ("autre autre autre autre") cost little BLEU
#: but make a translation unusable.
CANDIDATES: tuple[Decoding, ...] = tuple(
    Decoding(beam_size=beam, length_penalty=lp, no_repeat_ngram=3)
    for beam, lp in ((1, 1.0), (4, 0.6), (4, 1.0))
)
