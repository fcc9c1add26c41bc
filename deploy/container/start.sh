#!/bin/sh
# Start step of the container image (its ENTRYPOINT).
#
#   start.sh                 -> context-proxy serve   (settings from CONTEXT_PROXY_* variables)
#   start.sh ARGS...         -> context-proxy ARGS... (e.g. "db upgrade", "sessions list")
#
# Binds 0.0.0.0 unless CONTEXT_PROXY_HOST says otherwise (a container must listen on its
# interface), and reads tiktoken's files from the directory baked in at build time.
# exec: the proxy is PID 1's only child, so it receives SIGTERM itself (graceful shutdown).
set -eu
VENV_DIR="${VENV_DIR:-/opt/context-proxy}"
export CONTEXT_PROXY_HOST="${CONTEXT_PROXY_HOST:-0.0.0.0}"
export CONTEXT_PROXY_TIKTOKEN_CACHE_DIR="${CONTEXT_PROXY_TIKTOKEN_CACHE_DIR:-$VENV_DIR/tiktoken}"
export TIKTOKEN_CACHE_DIR="${TIKTOKEN_CACHE_DIR:-$CONTEXT_PROXY_TIKTOKEN_CACHE_DIR}"
if [ "$#" -eq 0 ]; then set -- serve; fi
exec "$VENV_DIR/bin/context-proxy" "$@"
