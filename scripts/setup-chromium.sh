#!/usr/bin/env bash
# Headless Chromium for the browser check of the HTML report (tests/test_html_browser.py), from the
# Debian packages. Installs only when no Chromium is on the PATH; needs root (or sudo) for apt-get.
#
#   scripts/setup-chromium.sh               install if missing, print the binary's path
#   scripts/setup-chromium.sh --print-env   the same, then print `export AGENTLOAD_CHROMIUM=...`
#                                           (for eval in scripts/test.sh)
#
# AGENTLOAD_SKIP_BROWSER=1 skips the install (the browser test then skips with that reason).
set -euo pipefail

print_env=0
[ "${1:-}" = "--print-env" ] && print_env=1

if [ "${AGENTLOAD_SKIP_BROWSER:-0}" = "1" ]; then
  echo "AGENTLOAD_SKIP_BROWSER=1: not installing Chromium" >&2
  exit 0
fi

find_chromium() {
  for name in chromium chromium-browser google-chrome-stable google-chrome; do
    if command -v "$name" >/dev/null 2>&1; then
      command -v "$name"
      return 0
    fi
  done
  return 1
}

if ! bin=$(find_chromium); then
  SUDO=""
  if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
      echo "Chromium is missing and installing it needs root: run as root, or set AGENTLOAD_SKIP_BROWSER=1" >&2
      exit 1
    fi
  fi
  echo "installing chromium from the Debian packages ($(apt-cache policy chromium 2>/dev/null | awk '/Candidate/ {print $2}'))" >&2
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
  bin=$(find_chromium)
fi

"$bin" --version >&2 || true
if [ "$print_env" = "1" ]; then
  printf 'export AGENTLOAD_CHROMIUM=%q\n' "$bin"
else
  echo "$bin"
fi
