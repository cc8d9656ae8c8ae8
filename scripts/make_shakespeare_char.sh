#!/usr/bin/env bash
# Rebuilds the model gpt2 ships as `shakespeare_char` (src/gpt2/embedded/shakespeare_char/):
# the shipped tinyshakespeare, by characters, trained with the shipped recipe, then scored.
#
#   scripts/make_shakespeare_char.sh [OUT] [gpt2 train flags...]
#
# OUT defaults to the package's directory; flags given after it override the recipe's
# (the tests pass --max-iters 2). Nothing but the model's own files lands in OUT: the data and
# the run (checkpoint.pt, log.jsonl, loss.png) stay in a temporary directory, removed at the end.
# A few minutes on 2 CPU cores.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$repo/src/gpt2/embedded/shakespeare_char}
shift $(( $# > 0 ? 1 : 0 ))
gpt2=${GPT2:-gpt2}  # the command; GPT2="python -m gpt2" where it is not on PATH
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

$gpt2 prepare shakespeare --out "$work/data" --tokenizer char --no-progress
$gpt2 train --recipe shakespeare_char --data "$work/data" --out "$work/run" --no-progress "$@"
mkdir -p "$out"
for file in config.json model.safetensors chars.json tokenizer.json tokenizer_config.json; do
    cp "$work/run/$file" "$out/$file"
done
# The validation loss that the model card records and tests/test_examples.py checks against transformers:
# every id of val.bin, in windows of 64 moved by 32 (gpt2 eval's defaults for this model).
$gpt2 eval --model "$out" --data "$work/data" --no-progress --batch-size 256
