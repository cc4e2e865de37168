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
if [ "$(id -u)" != "0" ]; then
    echo "ensure_chromium: $CHROMIUM is missing and installing it needs root" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_chromium: no apt-get here; install Chromium by hand" >&2
    exit 1
fi
echo "ensure_chromium: installing Debian's chromium for the browser tests (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null
test -x "$CHROMIUM"
