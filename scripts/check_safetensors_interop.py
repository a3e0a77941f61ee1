#!/usr/bin/python3
"""safetensors interoperability between PyTorch and demi, with the format read and written by hand
(struct + json + torch.frombuffer; Debian has no `safetensors` package), so that the check depends only
on python3-torch and on the format's specification.

  check_safetensors_interop.py write-fixture DIR
      Writes, as PyTorch/Hugging Face tools would (tensors ordered by alignment then name, no demi
      metadata), DIR/torch_tiny.safetensors: the weights of a small conv net (the twin of the demi net in
      demi/train/checkpoint_test.cc) under demi's parameter names, a batch `input` and torch's eval-mode
      `logits`, and one `sample.<dtype>` tensor per dtype with values the C++ test recomputes; and
      DIR/torch_tiny_bf16.safetensors: the same weights saved in bfloat16, with the logits torch computes
      from those rounded weights.
  check_safetensors_interop.py check-demi CHECKPOINT BATCH --model {tiny,lenet,lenet-bn} [--tol T]
      Reads a demi checkpoint (verifying demi's CRC-32s), loads its weights into the torch twin of the
      model (optimizer state and metadata ignored), runs BATCH's `input` in eval mode and compares with
      BATCH's `logits` (demi's). Exit status 0 when the largest difference is within T.
"""
import argparse
import json
import struct
import sys
import zlib

import torch
import torch.nn as nn

DTYPES = {
    "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
    "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool,
}
CODES = {v: k for k, v in DTYPES.items()}


# ---- the format, by hand ----

def tensor_bytes(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def write_safetensors(path, tensors, metadata=None, order=None):
    """Writes `tensors` (name -> tensor). `order` lists the names in data order (default: Hugging Face's,
    larger alignment first, then by name)."""
    if order is None:
        order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name in order:
        t = tensors[name]
        data = tensor_bytes(t)
        header[name] = {"dtype": CODES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def demi_header_crc(entries, metadata):
    """demi.header_crc32 (see demi/io/safetensors.h): per tensor sorted by name
    name NUL dtype NUL dims-joined-by-comma NUL begin NUL end LF, then per metadata key sorted (except
    demi.header_crc32) key NUL value LF."""
    s = b""
    for name in sorted(entries):
        e = entries[name]
        s += b"\0".join([name.encode(), e["dtype"].encode(), ",".join(str(d) for d in e["shape"]).encode(),
                         str(e["data_offsets"][0]).encode(), str(e["data_offsets"][1]).encode()]) + b"\n"
    for k in sorted(metadata):
        if k != "demi.header_crc32":
            s += k.encode() + b"\0" + metadata[k].encode() + b"\n"
    return "%08x" % zlib.crc32(s)


def read_safetensors(path):
    """Returns (tensors in data order, metadata); verifies demi's CRCs when present."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(raw[8:8 + n])
    metadata = header.pop("__metadata__", {})
    data = raw[8 + n:]
    if "demi.payload_crc32" in metadata:
        got = "%08x" % zlib.crc32(data)
        if got != metadata["demi.payload_crc32"]:
            raise ValueError(f"{path}: data checksum mismatch ({got} != {metadata['demi.payload_crc32']})")
        got = demi_header_crc(header, metadata)
        if got != metadata["demi.header_crc32"]:
            raise ValueError(f"{path}: header checksum mismatch ({got} != {metadata['demi.header_crc32']})")
    tensors = {}
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, end = e["data_offsets"]
        dt = DTYPES[e["dtype"]]
        buf = bytearray(data[b:end])  # writable copy: torch.frombuffer warns on read-only buffers
        t = torch.frombuffer(buf, dtype=dt) if buf else torch.empty(0, dtype=dt)
        tensors[name] = t.reshape(e["shape"])
    return tensors, metadata


# ---- the torch twins of demi's models, under demi's parameter names ----

BN_NAMES = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}


def demi_state_dict(model):
    """model.state_dict() renamed as demi names it (BatchNorm: gamma/beta/moving_mean/moving_variance)."""
    bn = {name for name, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}
    out = {}
    for key, t in model.state_dict().items():
        mod, _, leaf = key.rpartition(".")
        if mod in bn:
            if leaf == "num_batches_tracked":
                continue
            leaf = BN_NAMES[leaf]
        out[f"{mod}.{leaf}" if mod else leaf] = t
    return out


def load_demi_weights(model, tensors):
    ours = demi_state_dict(model)
    torch_names = {}
    for key in model.state_dict():
        mod, _, leaf = key.rpartition(".")
        if leaf == "num_batches_tracked":
            continue
        demi_leaf = BN_NAMES.get(leaf, leaf) if isinstance(model.get_submodule(mod), nn.BatchNorm2d) else leaf
        torch_names[f"{mod}.{demi_leaf}"] = key
    weights = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    missing = sorted(set(ours) - set(weights))
    unexpected = sorted(set(weights) - set(ours))
    if missing or unexpected:
        raise ValueError(f"weights do not match the model: missing {missing}, unexpected {unexpected}")
    sd = {torch_names[k]: v.to(torch.float32) for k, v in weights.items()}
    model.load_state_dict(sd, strict=False)


def tiny():
    # demi: SequentialCell[Conv2d(1, 4, 3, pad 1, bias), BatchNorm2d(4), ReLU, MaxPool2d(2, 2), Flatten, Dense(64, 3)]
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2, 2),
                         nn.Flatten(), nn.Linear(64, 3))


def lenet(batch_norm):
    # demi/nn/models.h LeNet (model B)
    f = [nn.Conv2d(1, 32, 3, padding=1)] + ([nn.BatchNorm2d(32)] if batch_norm else []) + [nn.ReLU(), nn.MaxPool2d(2, 2)]
    f += [nn.Conv2d(32, 64, 3, padding=1)] + ([nn.BatchNorm2d(64)] if batch_norm else []) + [nn.ReLU(), nn.MaxPool2d(2, 2)]
    m = nn.Module()
    m.features = nn.Sequential(*f)
    m.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    m.forward = lambda x: m.classifier(m.features(x))
    return m


MODELS = {"tiny": tiny, "lenet": lambda: lenet(False), "lenet-bn": lambda: lenet(True)}


# ---- commands ----

def samples():
    """One tensor per dtype; demi/train/checkpoint_test.cc recomputes these values."""
    k = torch.arange(12)
    return {
        "sample.f32": (k * 0.25 - 1).to(torch.float32).reshape(3, 4),
        "sample.f16": (k * 0.25 - 1).to(torch.float16).reshape(3, 4),
        "sample.bf16": (k * 0.25 - 1).to(torch.bfloat16).reshape(3, 4),
        "sample.f64": (k * 0.25 - 1).to(torch.float64).reshape(3, 4),
        "sample.i64": (k * (1 << 40) - 7).to(torch.int64),
        "sample.i32": (k * 1000 - 6000).to(torch.int32),
        "sample.u8": (k * 21).to(torch.uint8),
        "sample.bool": (k % 3 == 0),
        "sample.scalar": torch.tensor(3.5),
    }


def write_fixture(out_dir):
    torch.manual_seed(1234)
    model = tiny()
    bn = model[1]
    with torch.no_grad():  # non-trivial running statistics and affine parameters
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.2, 0.2)
    model.eval()
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        logits = model(x)
    tensors = dict(demi_state_dict(model), input=x, logits=logits, **samples())
    write_safetensors(f"{out_dir}/torch_tiny.safetensors", tensors, {"format": "pt"})

    # The same weights in bfloat16 (a half-precision PyTorch save); logits from the rounded weights.
    half = {k: v.to(torch.bfloat16) for k, v in demi_state_dict(model).items()}
    load_demi_weights(model, half)
    with torch.no_grad():
        logits16 = model(x)
    write_safetensors(f"{out_dir}/torch_tiny_bf16.safetensors", dict(half, input=x, logits=logits16), {"format": "pt"})
    print(f"wrote {out_dir}/torch_tiny.safetensors and {out_dir}/torch_tiny_bf16.safetensors")


def check_demi(ckpt, batch, model_name, tol):
    tensors, metadata = read_safetensors(ckpt)
    model = MODELS[model_name]()
    load_demi_weights(model, tensors)
    model.eval()
    b, _ = read_safetensors(batch)
    with torch.no_grad():
        ours = model(b["input"].to(torch.float32))
    theirs = b["logits"].to(torch.float32)
    diff = (ours - theirs).abs().max().item()
    scale = theirs.abs().max().item()
    level = metadata.get("demi.amp_level", "?")
    print(f"{ckpt}: {len(tensors)} tensors, demi {level}/{metadata.get('demi.low_dtype', '?')}, "
          f"step {metadata.get('demi.global_step', '?')}; torch logits vs demi's: max |diff| {diff:.3g} "
          f"(max |logit| {scale:.3g}, tolerance {tol:g})")
    return diff <= tol


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write-fixture")
    w.add_argument("dir")
    c = sub.add_parser("check-demi")
    c.add_argument("checkpoint")
    c.add_argument("batch")
    c.add_argument("--model", choices=sorted(MODELS), required=True)
    c.add_argument("--tol", type=float, default=1e-4)
    a = p.parse_args()
    if a.cmd == "write-fixture":
        write_fixture(a.dir)
        return 0
    return 0 if check_demi(a.checkpoint, a.batch, a.model, a.tol) else 1


if __name__ == "__main__":
    sys.exit(main())
