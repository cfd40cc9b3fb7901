#!/usr/bin/env bash
# Installs the Citus extension into the machine's PostgreSQL when it is
# missing, for make test-citus (the tests start a throwaway Citus cluster
# from the installed PostgreSQL; see internal/pglocal). Debian has no Citus
# package, so Citus is built from source:
#   - CITUS_SRC: a checkout of citusdata/citus (v13.2.2), built with its
#     own configure and make;
#   - else $CITUS_DIR/build.sh, CITUS_DIR being by default the first of
#     ../shared/citus (beside the repository) and /work/shared/citus that
#     exists (the source as a tarball, with its build script).
# Quick when Citus is installed.
#
#   scripts/install-citus.sh
#   CITUS_SRC=~/src/citus scripts/install-citus.sh
#   CITUS_DIR=/path/to/citus PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config scripts/install-citus.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
export PG_CONFIG
if [[ ! -x $PG_CONFIG ]]; then
  echo "install-citus: no pg_config at $PG_CONFIG: set PG_CONFIG to the pg_config of the PostgreSQL the tests run (15, 16 or 17)" >&2
  exit 1
fi

libdir=$("$PG_CONFIG" --pkglibdir 2>/dev/null || true)
sharedir=$("$PG_CONFIG" --sharedir 2>/dev/null || true)
if [[ -n $libdir && -f $libdir/citus.so && -f $sharedir/extension/citus.control ]]; then
  echo "citus $(sed -n "s/^default_version = '\(.*\)'/\1/p" "$sharedir/extension/citus.control") installed in $libdir"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo --preserve-env=PG_CONFIG"; else
    echo "install-citus: Citus is missing and this user cannot install it: build and install it as root" >&2; exit 1
  fi
fi

if [[ -n ${CITUS_SRC:-} ]]; then
  if [[ ! -x $CITUS_SRC/configure ]]; then
    echo "install-citus: CITUS_SRC=$CITUS_SRC is not a Citus source tree (no configure): check out https://github.com/citusdata/citus at tag v13.2.2" >&2
    exit 1
  fi
  echo "install-citus: building Citus from $CITUS_SRC (6-12 minutes on 2 cores)"
  if command -v apt-get >/dev/null 2>&1; then
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "postgresql-server-dev-$("$PG_CONFIG" --version | sed 's/^PostgreSQL \([0-9]*\).*/\1/')" \
      build-essential liblz4-dev libzstd-dev libkrb5-dev libselinux1-dev libxslt1-dev libpam0g-dev libreadline-dev >/dev/null
  fi
  cd "$CITUS_SRC"
  PG_CONFIG=$PG_CONFIG ./configure --without-libcurl >/dev/null
  make -j"$(nproc)" >/dev/null
  $sudo make install >/dev/null
  echo "install-citus: citus installed in $("$PG_CONFIG" --pkglibdir)"
  exit 0
fi

if [[ -z ${CITUS_DIR:-} ]]; then
  for d in "$root/../shared/citus" /work/shared/citus; do
    if [[ -f $d/build.sh ]]; then CITUS_DIR=$(cd "$d" && pwd); break; fi
  done
fi
if [[ -z ${CITUS_DIR:-} || ! -f $CITUS_DIR/build.sh ]]; then
  cat >&2 <<EOF
install-citus: Citus is not installed in the PostgreSQL of $PG_CONFIG, and there
is no Citus build directory (build.sh and citus-13.2.2.tar.gz) at
${CITUS_DIR:-$root/../shared/citus or /work/shared/citus}.
Set CITUS_SRC to a checkout of citusdata/citus (v13.2.2), or CITUS_DIR to such
a directory, or install Citus 13.2 (for PostgreSQL 15)
yourself: source at https://github.com/citusdata/citus (tag v13.2.2),
packages at https://docs.citusdata.com/en/stable/installation/.
EOF
  exit 1
fi

echo "install-citus: building Citus with $CITUS_DIR/build.sh (6-12 minutes on 2 cores)"
$sudo "$CITUS_DIR/build.sh"
