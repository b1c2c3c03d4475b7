#!/usr/bin/env bash
# The GPU smoke tier: `patchctl smoke ENGINE@latest --tier gpu` for every engine the store has a
# series for. Writes smoke-ENGINE.json into the output folder (default: .) and a line per engine to
# the job summary; exits non-zero when any engine's checks failed, after running all of them.
set -uo pipefail

out="${1:-.}"
store="${PATCHCTL_STORE:-patches}"
mkdir -p "$out"
status=0
shopt -s nullglob
series=("$store"/*/series.yaml)
if [ ${#series[@]} -eq 0 ]; then
  echo "gpu tier: no engine series under $store" | tee -a "${GITHUB_STEP_SUMMARY:-/dev/null}"
  exit 0
fi
for file in "${series[@]}"; do
  engine="$(basename "$(dirname "$file")")"
  patchctl smoke "${engine}@latest" --tier gpu --store "$store" --json > "$out/smoke-${engine}.json"
  rc=$?
  case $rc in
    0) line="gpu tier: ${engine}@latest passed" ;;
    1) line="gpu tier: ${engine}@latest FAILED (see smoke-${engine}.json)"; status=1 ;;
    *) line="gpu tier: ${engine}@latest could not run (exit ${rc}, see smoke-${engine}.json)"; status=1 ;;
  esac
  echo "$line" | tee -a "${GITHUB_STEP_SUMMARY:-/dev/null}"
done
exit $status
