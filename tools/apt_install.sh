#!/bin/sh
# Install Debian packages for a make target, or say in one line why it cannot:
#   sh tools/apt_install.sh WHO WHY PACKAGE...
# WHO names the caller in its messages, WHY what the packages are for. Needs root and
# apt-get; exits non-zero (with the reason on stderr) without them. tools/ensure_chromium.sh
# and tools/ensure_fonts.sh call it; qkv itself never installs anything.
set -eu
who="$1" why="$2"
shift 2
if [ "$(id -u)" != "0" ]; then
    echo "$who: $* missing, and installing it needs root" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "$who: no apt-get here; install $* by hand" >&2
    exit 1
fi
echo "$who: installing Debian's $* $why (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "$@" >/dev/null
