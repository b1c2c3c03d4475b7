#!/usr/bin/env bash
# Hands the package index from the repository's settings (secret or variable PIP_INDEX_URL, passed
# in as INDEX_URL) to every later step of the job through pip's own PIP_INDEX_URL, which patchctl
# also reads. Unset or empty: nothing is exported, so pip's default configuration stands; an empty
# PIP_INDEX_URL would instead be taken literally by pip. The value is masked in logs because index
# URLs often carry credentials.
set -euo pipefail

if [ -z "${INDEX_URL:-}" ]; then
  echo "package index: pip's default configuration"
  exit 0
fi
echo "::add-mask::${INDEX_URL}"
echo "PIP_INDEX_URL=${INDEX_URL}" >> "${GITHUB_ENV:?GITHUB_ENV is set by GitHub Actions}"
echo "package index: from the repository's PIP_INDEX_URL setting"
