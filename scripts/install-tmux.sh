#!/usr/bin/env bash
# Installs tmux from Debian's packages. The test of dam top drives it in a
# terminal through tmux, as a person would see it; it fails loudly in CI
# when tmux is missing.
set -euo pipefail
if command -v tmux >/dev/null 2>&1; then exit 0; fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "tmux is missing and this user cannot install it: run 'apt-get install tmux' as root" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq tmux >/dev/null
command -v tmux >/dev/null
