#!/usr/bin/env bash
# gpt_meta_cli_test.sh DEMI CKPT_DIR DIR: `demi generate` on a GPT checkpoint whose metadata claims more
# than its tensors could hold (10^8 layers, a context of 10^12) refuses it naming the key, at once, instead
# of building the network (it once ran out of memory, and aborted while freeing); a vocabulary without the
# default prompt's characters is said to be the default prompt's problem; a NaN weight is refused naming
# the tensor, and loaded with --allow-non-finite.
set -uo pipefail
demi=$1 ckpt=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() {
  echo "gpt_meta_cli_test: $*"
  exit 1
}
src="$ckpt/$(cat "$ckpt/gpt-latest")"
[[ -f $src ]] || fail "no GPT checkpoint at $src"
# craft DST KEY VALUE [NAN_TENSOR]: the checkpoint with one metadata value changed (KEY "-": none) (and demi's CRCs dropped, as
# a file from elsewhere has none); VALUE "@vocab-without-I" is the vocabulary with 'I' swapped for a snowman;
# NAN_TENSOR names a float32 tensor whose last value becomes NaN.
craft() {
  python3 - "$src" "$@" << 'PY' || fail "could not craft $1"
import json, struct, sys
src, dst, key, value = sys.argv[1:5]
nan_tensor = sys.argv[5] if len(sys.argv) > 5 else None
raw = bytearray(open(src, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
meta = header["__metadata__"]
meta.pop("demi.header_crc32", None)
meta.pop("demi.payload_crc32", None)
if value == "@vocab-without-I":
    chars = meta[key][len("char:"):]
    value = "char:" + "".join(sorted(set(chars) - {"I"} | {"\u2603"}))
if key != "-":
    meta[key] = value
data = raw[8 + n:]
if nan_tensor:
    t = header[nan_tensor]
    assert t["dtype"] == "F32", t
    end = t["data_offsets"][1]
    data[end - 4:end] = struct.pack("<f", float("nan"))
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * ((8 - len(text) % 8) % 8)
open(dst, "wb").write(struct.pack("<Q", len(text)) + text + bytes(data))
PY
}
for kv in gpt.n_layer=100000000 gpt.block_size=1000000000000 gpt.n_embd=99999999; do
  key=${kv%%=*} value=${kv#*=}
  craft "$dir/bad.safetensors" "$key" "$value"
  out=$(timeout 60 "$demi" generate --checkpoint "$dir/bad.safetensors" --tokens 5 2>&1)
  status=$?
  [[ $status -ne 124 ]] || fail "$key=$value: generate hung"
  [[ $status -eq 1 ]] || fail "$key=$value: expected a clear error (exit 1), got exit $status: $out"
  grep -q "metadata's '$key' is $value, more than" <<< "$out" || fail "$key=$value: the error does not name the key: $out"
done

# The default prompt ("In the beginning") in a vocabulary without 'I': a usage error that says so.
craft "$dir/no_I.safetensors" gpt.vocab @vocab-without-I
out=$("$demi" generate --checkpoint "$dir/no_I.safetensors" --tokens 5 2>&1)
status=$?
[[ $status -eq 2 ]] || fail "default prompt outside the vocabulary: expected exit 2, got $status: $out"
grep -q 'the default prompt "In the beginning" does not fit this checkpoint: character '"'"'I'"'"' at byte 0' <<< "$out" ||
  fail "the error does not say it is the default prompt: $out"
"$demi" generate --checkpoint "$dir/no_I.safetensors" --prompt "the" --tokens 5 > /dev/null 2>&1 ||
  fail "a prompt of the checkpoint's characters was refused"

# NaN in the last position embedding (a position that 6 + 5 tokens never reach in the test's context of 16):
# refused naming the tensor; loaded, and sampled from, with --allow-non-finite.
wpe=$(python3 -c 'import json,struct,sys; r=open(sys.argv[1],"rb").read(); n=struct.unpack("<Q",r[:8])[0]
print(next(k for k in json.loads(r[8:8+n]) if k.endswith("wpe")))' "$src") || fail "no wpe tensor in $src"
craft "$dir/nan.safetensors" - - "$wpe"
out=$("$demi" generate --checkpoint "$dir/nan.safetensors" --tokens 5 2>&1)
status=$?
[[ $status -eq 1 ]] || fail "NaN weights: expected exit 1, got $status: $out"
grep -Eq "$wpe: 1 of [0-9]+ values are NaN or infinite" <<< "$out" || fail "the refusal does not name the tensor and the count: $out"
out=$("$demi" generate --checkpoint "$dir/nan.safetensors" --prompt "In the" --tokens 5 --allow-non-finite 2>/dev/null)
status=$?
[[ $status -eq 0 && $out =~ ^In\ the.{5}$ ]] || fail "--allow-non-finite: exit $status, output '$out'"
echo "gpt_meta_cli_test: ok"
