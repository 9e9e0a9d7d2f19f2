#!/usr/bin/env bash
# Debian's chromium and chromedriver, for the browser test (tests/test_trace.py drives them
# through selenium, which comes with the [test] extra). Installs them with apt-get (as root, or
# through sudo) unless both are on PATH already. `make browser` and .ci/run call it.
set -euo pipefail
if { command -v chromium || command -v chromium-browser; } >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "pvf-lmeval: installing chromium needs root or sudo: apt-get install chromium chromium-driver" >&2
        exit 1
    fi
    SUDO="sudo"
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver
