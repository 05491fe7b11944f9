#!/bin/bash
# The default model, start to finish: corpus -> tokenizer -> training (time budget) -> export ->
# logit check against moeserve. See README.md.
#
#   train_default_model.sh MOESERVE_BINARY WORK_DIR [extra train.py flags...]
#
# Environment: SOURCE (corpus, default kjv+austen), VOCAB (default 8192), PRESET (default
# h256-e16), MINUTES (time budget, default 120). A rerun resumes training from
# WORK_DIR/run/checkpoint.pt (the corpus and tokenizer are kept).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 MOESERVE_BINARY WORK_DIR [train.py flags...]" >&2
  exit 2
fi
MOESERVE=$(realpath "$1")
WORK=$2
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
SOURCE=${SOURCE:-kjv+austen}
VOCAB=${VOCAB:-8192}
PRESET=${PRESET:-h256-e16}
MINUTES=${MINUTES:-120}

mkdir -p "$WORK"
if [[ ! -s $WORK/corpus/corpus.jsonl ]]; then
  $PY "$HERE/prepare_corpus.py" --source "$SOURCE" --out "$WORK/corpus"
fi
if [[ ! -s $WORK/tokenizer/tokenizer.json ]]; then
  "$MOESERVE" train-tokenizer --corpus "$WORK/corpus/corpus.txt" --vocab-size "$VOCAB" \
    --out "$WORK/tokenizer"
fi
$PY "$HERE/train.py" --corpus-dir "$WORK/corpus" --tokenizer "$WORK/tokenizer" \
  --moeserve "$MOESERVE" --out "$WORK/run" --preset "$PRESET" \
  --time-budget-minutes "$MINUTES" --resume --samples "$@" 2>&1 | tee -a "$WORK/train.log"
$PY "$HERE/export.py" --checkpoint "$WORK/run/checkpoint.pt" --tokenizer "$WORK/tokenizer" \
  --out "$WORK/model"
$PY "$HERE/check_logits.py" --moeserve "$MOESERVE" --model "$WORK/model" | tee "$WORK/check.txt"
echo "train_default_model: model in $WORK/model, loss curve $WORK/run/loss.png," \
  "samples $WORK/run/samples.txt"
