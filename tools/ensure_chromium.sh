#!/bin/sh
# Install Debian's chromium package when it is missing: the headless browser that
# tests/viz drives over the DevTools protocol to test the HTML attention viewer.
# `make test` runs this (the tests never install anything); QKV_CHROMIUM is where the
# tests look for the browser (default /usr/bin/chromium, where Debian's package puts it).
# Needs root (apt-get); prints why and exits non-zero when it cannot install.
set -eu
CHROMIUM="${QKV_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then
    exit 0
fi
# this folder without dirname (the tests run make with a PATH of sh alone)
case "$0" in */*) here="${0%/*}" ;; *) here=. ;; esac
sh "$here/apt_install.sh" ensure_chromium "for the browser tests" chromium
test -x "$CHROMIUM"
