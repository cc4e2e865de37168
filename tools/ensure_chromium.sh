#!/bin/sh
# Install Debian's chromium package when it is missing: the headless browser that
# tests/viz drives over the DevTools protocol to test the HTML attention viewer.
# Needs root (apt-get); prints why and exits non-zero when it cannot install.
set -eu
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "ensure_chromium: /usr/bin/chromium is missing and installing it needs root" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_chromium: no apt-get here; install Chromium by hand" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null
test -x /usr/bin/chromium
