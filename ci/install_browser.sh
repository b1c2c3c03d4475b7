#!/usr/bin/env bash
# Installs Debian's chromium for the HTML matrix screenshot test (tests/matrix/test_html_page.py).
# Idempotent: does nothing when /usr/bin/chromium is there. Never fatal for the caller's test run:
# without a browser that test skips and says why, so a missing apt is reported, not raised.
set -uo pipefail

if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_browser: no apt-get here; the screenshot test will skip" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install_browser: not root and no sudo; the screenshot test will skip" >&2
    exit 0
  fi
fi
export DEBIAN_FRONTEND=noninteractive
# A fresh machine's package lists may be empty; chromium is not found until they are read.
$SUDO apt-get update -q >/dev/null || echo "install_browser: apt-get update failed" >&2
if ! $SUDO apt-get install -y -q --no-install-recommends chromium >/dev/null; then
  echo "install_browser: apt-get install chromium failed; the screenshot test will skip" >&2
fi
exit 0
