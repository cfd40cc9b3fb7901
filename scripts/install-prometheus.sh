#!/usr/bin/env bash
# Installs prometheus and promtool from Debian's prometheus package. The
# alert rules' tests need promtool; the end-to-end test runs a real
# Prometheus server. Both fail loudly when they are missing.
set -euo pipefail
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then exit 0; fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "prometheus is missing and this user cannot install it: run 'apt-get install prometheus' as root" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# No recommends (node exporter, ...); the package's service is not needed:
# the tests start their own server.
$sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v promtool >/dev/null && command -v prometheus >/dev/null
