#!/usr/bin/env bash
# Headless Chromium for the dashboard's browser test (tests/nightly/test_dashboard.py): the Debian
# packages chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver). Idempotent;
# `make test` runs it. As root it installs them with apt-get; otherwise it says what to run and
# exits 0 (the browser test then fails, naming this script).
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  echo "setup-browser: $(/usr/bin/chromium --version 2>/dev/null | head -1) and chromedriver present"
  exit 0
fi
PKGS=(chromium chromium-driver)
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-browser: /usr/bin/chromium or /usr/bin/chromedriver is missing; the dashboard's" \
       "browser test will fail. Install them as root: apt-get install -y --no-install-recommends" \
       "${PKGS[*]} (or: sudo make setup-browser)" >&2
  exit 0
fi
echo "setup-browser: installing ${PKGS[*]} (apt-get)"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "${PKGS[@]}" \
  || { apt-get update && apt-get install -y --no-install-recommends "${PKGS[@]}"; }
/usr/bin/chromium --version
