#!/usr/bin/python3
"""PyTorch twin of demi's model D (BENCHMARKS.md): token embedding (vocab 1000, d 256) + learned positions,
4 post-norm encoder layers (4 heads, FFN 1024, ReLU, no dropout), mean pool, Linear(256 -> 10); 128 random
tokens, batch 32, SGD(0.01, momentum 0.9). Timed like bench/torch_models.py (median step after warm-up,
forward + loss + backward + update with zero-grad); prints one JSON line.

    /usr/bin/python3 bench/torch_model_d.py --precision bf16 --steps 10
(with BENCHMARKS.md's environment: MALLOC_* tuning, OPENBLAS_NUM_THREADS=2, OMP_WAIT_POLICY=PASSIVE for fp32)
"""
import argparse
import json
import resource

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_models import median_step


class ModelD(nn.Module):
    def __init__(self, vocab=1000, d=256, layers=4, heads=4, ffn=1024, seq=128, classes=10):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d)
        self.pos_embedding = nn.Parameter(torch.randn(seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, activation="relu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.classifier = nn.Linear(d, classes)

    def forward(self, tokens):
        x = self.embedding(tokens) + self.pos_embedding
        return self.classifier(self.encoder(x).mean(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    net = ModelD()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    xs = [torch.randint(0, 1000, (args.batch, 128)) for _ in range(4)]
    ys = [torch.randint(0, 10, (args.batch,)) for _ in range(4)]
    med, loss = median_step(net, opt, xs, ys, args.precision, args.warmup, args.steps)
    print(json.dumps({"framework": "pytorch", "model": "D", "setting": args.precision, "batch": args.batch,
                      "samples_per_second": args.batch / med, "median_step_ms": med * 1e3,
                      "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "final_loss": loss}))


if __name__ == "__main__":
    main()
