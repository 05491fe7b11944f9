#!/bin/bash
# The training tools end to end at toy size (ctest train_smoke): corpus slice -> `moeserve
# train-tokenizer` -> two training steps of the tiny preset -> export -> moeserve's logits (main
# and MTP) against the PyTorch model's, on the exported folder and on a make-model folder (whose
# random weights have the scale of trained ones, so routing, gates and norms all matter), and the
# MTP acceptance measurement.
#
#   smoke_test.sh MOESERVE_BINARY WORK_DIR
#
# Needs Debian's python3-torch, python3-numpy, python3-matplotlib and bible-kjv (the corpus).
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 MOESERVE_BINARY WORK_DIR" >&2
  exit 2
fi
MOESERVE=$(realpath "$1")
WORK=$2
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3  # Debian's, which has torch (a pyenv python3 on PATH may not)

fail() {
  echo "train_smoke: FAILED: $*" >&2
  exit 1
}
step() { echo "train_smoke: $*"; }

[[ -x $MOESERVE ]] || fail "no moeserve binary at $MOESERVE"
$PY -c 'import torch, numpy, matplotlib' 2>/dev/null ||
  fail "$PY lacks torch/numpy/matplotlib (apt-get install python3-torch python3-numpy python3-matplotlib)"
command -v bible >/dev/null || fail "no corpus: the 'bible' program is missing (apt-get install bible-kjv)"

rm -rf "$WORK"
mkdir -p "$WORK"
start=$SECONDS

step "corpus slice"
$PY "$HERE/prepare_corpus.py" --source kjv --max-bytes 200000 --out "$WORK/corpus" ||
  fail "prepare_corpus.py"

step "tokenizer (vocab 512)"
"$MOESERVE" train-tokenizer --corpus "$WORK/corpus/corpus.txt" --vocab-size 512 \
  --out "$WORK/tokenizer" || fail "moeserve train-tokenizer"
for f in tokenizer.json tokenizer_config.json; do
  [[ -s $WORK/tokenizer/$f ]] || fail "train-tokenizer wrote no $f"
done

step "two training steps (tiny preset)"
$PY "$HERE/train.py" --tiny --corpus-dir "$WORK/corpus" --tokenizer "$WORK/tokenizer" \
  --moeserve "$MOESERVE" --out "$WORK/run" || fail "train.py --tiny"
[[ -s $WORK/run/checkpoint.pt && -s $WORK/run/log.csv && -s $WORK/run/loss.png ]] ||
  fail "train.py wrote no checkpoint, log or plot"

step "export"
$PY "$HERE/export.py" --checkpoint "$WORK/run/checkpoint.pt" --tokenizer "$WORK/tokenizer" \
  --out "$WORK/model" || fail "export.py"

step "moeserve loads the folder and generates"
"$MOESERVE" generate --model "$WORK/model" --prompt "In the beginning" --max-tokens 8 \
  >"$WORK/generate.txt" || fail "moeserve generate on the exported folder"

step "logits: moeserve vs PyTorch"
$PY "$HERE/check_logits.py" --moeserve "$MOESERVE" --model "$WORK/model" ||
  fail "moeserve's logits differ from the PyTorch model's (see above)"

step "MTP acceptance (two short greedy continuations)"
$PY "$HERE/mtp_acceptance.py" --model "$WORK/model" --tokens "$WORK/run/tokens.npz" --prompts 2 \
  --prompt-tokens 16 --new-tokens 12 || fail "mtp_acceptance.py"

step "logits on make-model's random weights (larger than a trained model's init)"
"$MOESERVE" make-model --arch qwen3_next --preset tiny --seed 7 --out "$WORK/random" ||
  fail "moeserve make-model"
$PY "$HERE/check_logits.py" --moeserve "$MOESERVE" --model "$WORK/random" ||
  fail "moeserve's logits differ from the PyTorch model's on random weights (see above)"

step "passed in $((SECONDS - start)) s"
