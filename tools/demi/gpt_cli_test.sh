#!/usr/bin/env bash
# demi train --model gpt --resume continues a run exactly: a run of 6 steps checkpoints after step 3 (mid-epoch:
# epochs are --eval-every 2 steps); resumed from that checkpoint alone, it ends with the same losses, digit for
# digit; so does a run with --recompute. gpt_cli_test.sh DEMI WORKDIR
set -euo pipefail
demi=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir"
args=(train --model gpt --eval-every 2 --block-size 16 --layers 1 --heads 2 --dim 32 --batch-size 4 --eval-windows 8
      --amp O2 --dtype bf16 --json)
straight=$("$demi" "${args[@]}" --steps 6 --ckpt-dir "$dir/a" --ckpt-every 3 --keep-ckpt 0 | tail -1)
mkdir "$dir/b" && cp "$dir/a/gpt-2_1.safetensors" "$dir/b/"  # epoch 2, its first step: step 3 in all
resumed=$("$demi" "${args[@]}" --steps 6 --ckpt-dir "$dir/b" --resume | tail -1)
losses() { grep -o '"train_loss":[^,]*,"valid_loss":[^,]*' <<< "$1"; }
echo "straight: $straight"
echo "resumed:  $resumed"
[[ -n "$(losses "$straight")" && "$(losses "$straight")" == "$(losses "$resumed")" ]] || { echo "gpt_cli_test: the resumed run differs"; exit 1; }
# --recompute (each block re-run in backward) trains bit for bit as the plain run.
recomputed=$("$demi" "${args[@]}" --steps 6 --recompute | tail -1)
echo "recomputed: $recomputed"
[[ "$(losses "$straight")" == "$(losses "$recomputed")" ]] || { echo "gpt_cli_test: the recomputed run differs"; exit 1; }
# Another shape is refused, naming what differs.
if out=$("$demi" "${args[@]}" --steps 6 --dim 64 --ckpt-dir "$dir/b" --resume 2>&1); then
  echo "gpt_cli_test: a resume with another --dim was accepted"; exit 1
fi
grep -q "trained with another n_embd (32, now 64)" <<< "$out" || { echo "gpt_cli_test: unexpected message: $out"; exit 1; }
echo "gpt_cli_test: ok"
