#!/bin/sh
# Install Debian's fonts-noto-cjk when no font has CJK glyphs: the PNG/SVG/PDF attention maps
# (qkv.viz) draw Chinese, Japanese and Korean tokens with it (DejaVu Sans, matplotlib's default,
# has Latin, Cyrillic and Arabic but no CJK). `make demo` and `make test` run this as root;
# qkv itself never installs anything: without the font it warns once, naming the package.
set -eu
if command -v fc-list >/dev/null 2>&1 && fc-list :lang=zh family 2>/dev/null | grep -q .; then
    exit 0
fi
# this folder without dirname (the tests run make with a PATH of sh alone)
case "$0" in */*) here="${0%/*}" ;; *) here=. ;; esac
sh "$here/apt_install.sh" ensure_fonts "for CJK tokens in figures" fonts-noto-cjk
