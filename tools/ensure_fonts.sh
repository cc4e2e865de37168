#!/bin/sh
# Install Debian's fonts-noto-cjk when no font has CJK glyphs: the PNG/SVG/PDF attention maps
# (qkv.viz) draw Chinese, Japanese and Korean tokens with it (DejaVu Sans, matplotlib's default,
# has Latin, Cyrillic and Arabic but no CJK). `make demo` and `make test` run this as root;
# qkv itself never installs anything: without the font it warns once, naming the package.
set -eu
if command -v fc-list >/dev/null 2>&1 && fc-list :lang=zh family 2>/dev/null | grep -q .; then
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "ensure_fonts: no font with CJK glyphs, and installing fonts-noto-cjk needs root" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_fonts: no apt-get here; install a font with CJK glyphs by hand" >&2
    exit 1
fi
echo "ensure_fonts: installing Debian's fonts-noto-cjk for CJK tokens in figures (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq fonts-noto-cjk >/dev/null
