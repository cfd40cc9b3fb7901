#!/usr/bin/env bash
# Installs kcat (librdkafka's command-line client) from Debian's packages.
# The interoperability test needs it; it fails loudly when kcat is missing.
set -euo pipefail
if command -v kcat >/dev/null 2>&1; then exit 0; fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "kcat is missing and this user cannot install it: run 'apt-get install kcat' as root" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq kcat >/dev/null
command -v kcat >/dev/null
