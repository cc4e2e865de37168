"""``python -m qkv``: the ``qkv`` command."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
