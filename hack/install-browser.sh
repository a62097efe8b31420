#!/usr/bin/env bash
# Install Debian's Chromium and ChromeDriver for the headless browser test of
# the DLQ admin page (pkg/admin). Idempotent: does nothing when
# /usr/bin/chromium and /usr/bin/chromedriver are already there. Needs root
# (CI runs as root) and the Debian package mirrors; exits non-zero, saying
# why, when it cannot install, so callers can report or skip.
set -euo pipefail

CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
DRIVER=${DRIVER:-/usr/bin/chromedriver}

if [[ -x $CHROMIUM && -x $DRIVER ]]; then
	echo "install-browser: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM") already installed"
	exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
	echo "install-browser: $CHROMIUM or $DRIVER is missing and this is not root; run: sudo apt-get install -y chromium chromium-driver" >&2
	exit 1
fi
if ! command -v apt-get >/dev/null; then
	echo "install-browser: $CHROMIUM or $DRIVER is missing and apt-get is not available" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
echo "install-browser: installing chromium and chromium-driver from Debian"
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
echo "install-browser: $("$CHROMIUM" --version)"
