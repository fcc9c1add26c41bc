#!/bin/sh
# Build step of the container image (the Dockerfile's build stage runs exactly this).
#
#   install.sh [SOURCE_DIR]
#
# 1. creates a virtual environment at $VENV_DIR (default /opt/context-proxy) and installs the
#    project from SOURCE_DIR's pyproject.toml (default: the current directory), non-editable;
# 2. puts tiktoken's encoding files in $TIKTOKEN_DIR (default $VENV_DIR/tiktoken), so the running
#    proxy never downloads: copied from $TIKTOKEN_SEED_DIR when set (offline builds, tests),
#    else downloaded; either way checked against the SHA-256 that tiktoken pins.
# $PIP_EXTRAS (e.g. "plot") selects optional extras.
set -eu
SOURCE_DIR="${1:-.}"
VENV_DIR="${VENV_DIR:-/opt/context-proxy}"
TIKTOKEN_DIR="${TIKTOKEN_DIR:-$VENV_DIR/tiktoken}"
PYTHON="${PYTHON:-python3}"

"$PYTHON" -m venv "$VENV_DIR"
"$VENV_DIR/bin/pip" install --no-cache-dir --disable-pip-version-check --quiet --upgrade pip
target="$SOURCE_DIR"
if [ -n "${PIP_EXTRAS:-}" ]; then target="$SOURCE_DIR[$PIP_EXTRAS]"; fi
"$VENV_DIR/bin/pip" install --no-cache-dir --disable-pip-version-check --quiet "$target"

mkdir -p "$TIKTOKEN_DIR"
"$VENV_DIR/bin/python" "$(dirname "$0")/fetch_tiktoken.py" "$TIKTOKEN_DIR"
echo "installed context-proxy in $VENV_DIR (tiktoken files in $TIKTOKEN_DIR)"
