#!/usr/bin/python3
"""PyTorch twin of `demi train --model gpt` (demi/nn/gpt.h: nanoGPT's architecture, names and init): a
character-level GPT trained on the same text with the same recipe — AdamW (0.9, 0.99), weight decay on the
weight matrices only, linear warm-up then cosine decay to lr / 10, global-norm clipping 1.0 — and the same
90/10 split. Windows are drawn with torch's generator (demi draws its own: the data order differs, the
distribution is the same). Prints one JSON line per evaluation and a summary: tokens/s (median step after
warm-up), validation loss (nats per character) and peak RSS.

    /usr/bin/python3 bench/torch_gpt.py --text ~/.cache/demi/kjv.txt --precision bf16 --steps 200
"""
import argparse
import json
import math
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)
        self.heads, self.dropout = heads, dropout

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch >= 2.0: the fused kernel
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # 1.13: nanoGPT's slow path
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
            att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
            y = F.softmax(att.float(), dim=-1).to(v.dtype) @ v
        x = x + F.dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, d)), self.dropout, self.training)
        return x + F.dropout(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)))), self.dropout, self.training)


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, d, dropout):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Parameter(torch.zeros(block, d))
        self.h = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.dropout = dropout
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = F.dropout(self.wte(idx) + self.wpe[: idx.shape[1]], self.dropout, self.training)
        for blk in self.h:
            x = blk(x)
        return self.ln_f(x) @ self.wte.weight.t()  # tied output projection


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", required=True)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-windows", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    text = open(args.text, encoding="utf-8").read()
    chars = sorted(set(text))
    ids = torch.tensor([{c: i for i, c in enumerate(chars)}[c] for c in text], dtype=torch.long)
    cut = int(len(ids) * 0.9)
    train, valid = ids[:cut], ids[cut:]
    net = GPT(len(chars), args.block, args.layers, args.heads, args.dim, 0.0)
    decay = [p for n, p in net.named_parameters() if p.dim() >= 2 and n not in ("wte.weight", "wpe")]
    rest = [p for n, p in net.named_parameters() if not (p.dim() >= 2 and n not in ("wte.weight", "wpe"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.99), eps=1e-8)

    def lr_at(step):
        if step < args.warmup:
            return args.lr * step / args.warmup
        p = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
        return args.lr / 10 + 0.5 * (args.lr - args.lr / 10) * (1 + math.cos(math.pi * p))

    def windows(data, n, gen):
        starts = torch.randint(0, len(data) - args.block - 1, (n,), generator=gen)
        x = torch.stack([data[s:s + args.block] for s in starts])
        y = torch.stack([data[s + 1:s + 1 + args.block] for s in starts])
        return x, y

    gen, vgen = torch.Generator().manual_seed(args.seed), torch.Generator().manual_seed(args.seed + 1)
    vx, vy = windows(valid, args.eval_windows, vgen)

    def evaluate():
        net.eval()
        losses = []
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            for i in range(0, len(vx), args.batch):
                logits = net(vx[i:i + args.batch]).float()
                losses.append(float(F.cross_entropy(logits.flatten(0, 1), vy[i:i + args.batch].flatten())))
        net.train()
        return statistics.mean(losses)

    times = []
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        x, y = windows(train, args.batch, gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = net(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        if step >= 3:
            times.append(time.perf_counter() - t0)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            print(json.dumps({"kind": "eval", "step": step + 1, "train_loss": float(loss), "valid_loss": evaluate()}),
                  flush=True)
    med = statistics.median(times)
    print(json.dumps({"kind": "summary", "framework": "pytorch", "torch": torch.__version__, "setting": args.precision,
                      "steps": args.steps, "tokens_per_second": args.batch * args.block / med,
                      "valid_loss": evaluate(), "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


if __name__ == "__main__":
    main()
