#!/usr/bin/env bash
# Installs the checkpoints of a tools/train/run_device_s8.sh run into models/ and prints the
# models/MANIFEST.md table rows (bytes, sha256) for them.
#
#   bash tools/train/install_checkpoints.sh CHECKPOINTS.tgz [RESULTS.tgz RUN_DIR]
#
# CHECKPOINTS.tgz holds stories260K-dspark/ and stories260K-dflash2/ (config.json,
# model.safetensors, train_log.json): config.json and model.safetensors go to
# models/stories260K-<family>/ with the LICENSE of models/stories260K-dflash (same terms: derived
# from the MIT stories260K); train_log.json goes to RUN_DIR (if given) as train_log_<family>.json.
# RESULTS.tgz (optional): its logs, eval JSONs and engine outputs are unpacked into RUN_DIR
# (e.g. tools/train/runs/2026-12-03-h200).
# Run from the repo root. Existing files are overwritten.
set -eu -o pipefail
CK=${1:?usage: install_checkpoints.sh CHECKPOINTS.tgz [RESULTS.tgz RUN_DIR]}
RES=${2:-}
RUN=${3:-}
[ -f models/stories260K/config.json ] || { echo "run from the repo root" >&2; exit 1; }
if [ -n "$RES" ] && [ -z "$RUN" ]; then echo "RESULTS.tgz needs RUN_DIR" >&2; exit 1; fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
tar xzf "$CK" -C "$TMP"
rows=""
for fam in dspark dflash2; do
  src=$TMP/stories260K-$fam
  dst=models/stories260K-$fam
  if [ ! -f "$src/model.safetensors" ] || [ ! -f "$src/config.json" ]; then
    echo "warning: $CK has no complete stories260K-$fam/, skipped" >&2
    continue
  fi
  mkdir -p "$dst"
  cp "$src/config.json" "$src/model.safetensors" "$dst/"
  cp models/stories260K-dflash/LICENSE "$dst/LICENSE"
  if [ -n "$RUN" ] && [ -f "$src/train_log.json" ]; then
    mkdir -p "$RUN" && cp "$src/train_log.json" "$RUN/train_log_$fam.json"
  fi
  echo "installed $dst"
  for f in LICENSE config.json model.safetensors; do
    rows="$rows| stories260K-$fam/$f | $(stat -c %s "$dst/$f") | $(sha256sum "$dst/$f" | cut -d' ' -f1) |
"
  done
done
if [ -n "$RES" ]; then
  mkdir -p "$TMP/res" "$RUN"
  tar xzf "$RES" -C "$TMP/res"
  for f in "$TMP"/res/*; do
    case $(basename "$f") in
      log*.txt | eval_*.json | engine_*.txt | data_eval_prompts.json) cp "$f" "$RUN/" ;;
    esac
  done
  echo "results in $RUN: $(ls "$RUN" | tr '\n' ' ')"
fi
echo
echo "models/MANIFEST.md rows:"
echo "| file | bytes | sha256 |"
echo "|---|---|---|"
printf "%s" "$rows"
