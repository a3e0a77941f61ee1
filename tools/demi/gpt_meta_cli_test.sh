#!/usr/bin/env bash
# gpt_meta_cli_test.sh DEMI CKPT_DIR DIR: `demi generate` on a GPT checkpoint whose metadata claims more
# than its tensors could hold (10^8 layers, a context of 10^12) refuses it naming the key, at once, instead
# of building the network (it once ran out of memory, and aborted while freeing).
set -uo pipefail
demi=$1 ckpt=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() {
  echo "gpt_meta_cli_test: $*"
  exit 1
}
src="$ckpt/$(cat "$ckpt/gpt-latest")"
[[ -f $src ]] || fail "no GPT checkpoint at $src"
for kv in gpt.n_layer=100000000 gpt.block_size=1000000000000 gpt.n_embd=99999999; do
  key=${kv%%=*} value=${kv#*=}
  # The same file with one metadata value changed (and demi's CRCs dropped, as a file from elsewhere has none).
  python3 - "$src" "$dir/bad.safetensors" "$key" "$value" << 'PY' || fail "could not craft the file"
import json, struct, sys
src, dst, key, value = sys.argv[1:]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
meta = header["__metadata__"]
meta.pop("demi.header_crc32", None)
meta.pop("demi.payload_crc32", None)
meta[key] = value
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * ((8 - len(text) % 8) % 8)
open(dst, "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
PY
  out=$(timeout 60 "$demi" generate --checkpoint "$dir/bad.safetensors" --tokens 5 2>&1)
  status=$?
  [[ $status -ne 124 ]] || fail "$key=$value: generate hung"
  [[ $status -eq 1 ]] || fail "$key=$value: expected a clear error (exit 1), got exit $status: $out"
  grep -q "metadata's '$key' is $value, more than" <<< "$out" || fail "$key=$value: the error does not name the key: $out"
done
echo "gpt_meta_cli_test: ok"
