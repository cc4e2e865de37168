"""Other frameworks' model folders, in and out: ``transformers``' MarianMTModel (OPUS-MT) as
a qkv model folder (``qkv import``).

One table per architecture maps its parameter names and options onto qkv's
(:mod:`qkv.interop.marian`); ``qkv import`` reads a folder through it, and the Hugging Face
export writes one through the same table, so one table is the truth both ways.

This package sits above :mod:`qkv.inference` (it reads and writes model folders through it)
and below :mod:`qkv.export`, :mod:`qkv.train` and the command line.
"""

from __future__ import annotations

__all__: list[str] = []
