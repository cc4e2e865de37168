"""``python -m qkv.cli``: the ``qkv`` command (as torchrun's workers start it)."""

from . import main

if __name__ == "__main__":
    raise SystemExit(main())
