#!/usr/bin/python3
"""Writes golden values from PyTorch (Debian's python3-torch) for demi's tests.

Run with Debian's interpreter: /usr/bin/python3 scripts/make_golden.py
Each fixture is a text file of tensors, one per line:
    name dtype rank d0 d1 ... : v0 v1 ...
with float64 values printed to 17 significant digits, so the C++ tests (tests/golden_test.cc) need no
Python. Inputs are drawn from a seeded generator; the fixtures are committed.
"""
import os
import sys

import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden")
torch.manual_seed(20261130)
torch.set_num_threads(1)


def write(name, tensors):
    path = os.path.join(OUT, name + ".txt")
    with open(path, "w") as f:
        for key, t in tensors.items():
            t = t.detach()
            dtype = "int64" if t.dtype in (torch.int64, torch.int32) else "float64"
            vals = t.reshape(-1).tolist()
            if dtype == "float64":
                body = " ".join(repr(float(v)) for v in vals)
            else:
                body = " ".join(str(int(v)) for v in vals)
            f.write(f"{key} {dtype} {t.dim()} {' '.join(str(d) for d in t.shape)} : {body}\n")
    print("wrote", path, file=sys.stderr)


def rand(*shape):
    return torch.randn(tuple(shape), dtype=torch.float64)


def grads_of(out, inputs):
    """Backward of sum(out * r) for a random r; returns r and the input gradients."""
    r = rand(*out.shape)
    gs = torch.autograd.grad((out * r).sum(), inputs)
    return r, gs


def dense():
    x, w, b = rand(4, 5).requires_grad_(), rand(3, 5).requires_grad_(), rand(3).requires_grad_()
    y = F.linear(x, w, b)
    r, (dx, dw, db) = grads_of(y, (x, w, b))
    write("dense", dict(x=x, w=w, b=b, y=y, dy=r, dx=dx, dw=dw, db=db))


def conv(name, n, c, h, w_, oc, k, stride, padding, dilation, groups, bias=True):
    x = rand(n, c, h, w_).requires_grad_()
    w = rand(oc, c // groups, k, k).requires_grad_()
    b = rand(oc).requires_grad_() if bias else None
    y = F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    inputs = (x, w, b) if bias else (x, w)
    r, gs = grads_of(y, inputs)
    d = dict(x=x, w=w, y=y, dy=r, dx=gs[0], dw=gs[1])
    if bias:
        d.update(b=b, db=gs[2])
    write(name, d)


def pools():
    x = rand(2, 3, 9, 8).requires_grad_()
    y = F.max_pool2d(x, 2, 2)
    r, (dx,) = grads_of(y, (x,))
    write("max_pool2d", dict(x=x, y=y, dy=r, dx=dx))
    x = rand(2, 3, 9, 8).requires_grad_()
    y = F.avg_pool2d(x, 3, 2)
    r, (dx,) = grads_of(y, (x,))
    write("avg_pool2d", dict(x=x, y=y, dy=r, dx=dx))


def activations():
    d = {}
    for name, fn in [("relu", F.relu), ("sigmoid", torch.sigmoid), ("tanh", torch.tanh),
                     ("gelu", lambda t: F.gelu(t)), ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh")),
                     ("silu", F.silu)]:
        x = rand(3, 7).requires_grad_()
        y = fn(x)
        r, (dx,) = grads_of(y, (x,))
        d.update({f"{name}.x": x, f"{name}.y": y, f"{name}.dy": r, f"{name}.dx": dx})
    write("activations", d)


def softmax_losses():
    d = {}
    x = rand(4, 6).requires_grad_()
    y = torch.softmax(x, -1)
    r, (dx,) = grads_of(y, (x,))
    d.update({"softmax.x": x, "softmax.y": y, "softmax.dy": r, "softmax.dx": dx})
    x = rand(4, 6).requires_grad_()
    y = torch.log_softmax(x, -1)
    r, (dx,) = grads_of(y, (x,))
    d.update({"log_softmax.x": x, "log_softmax.y": y, "log_softmax.dy": r, "log_softmax.dx": dx})
    labels = torch.tensor([1, 0, 5, 3])
    for red in ["mean", "sum", "none"]:
        x = rand(4, 6).requires_grad_()
        loss = F.cross_entropy(x, labels, reduction=red)
        r, (dx,) = grads_of(loss, (x,))
        d.update({f"ce_{red}.x": x, f"ce_{red}.labels": labels, f"ce_{red}.loss": loss,
                  f"ce_{red}.dloss": r, f"ce_{red}.dx": dx})
    x = rand(4, 6).requires_grad_()
    p = torch.softmax(rand(4, 6), -1)
    loss = -(p * torch.log_softmax(x, -1)).sum(-1).mean()
    (dx,) = torch.autograd.grad(loss, (x,))
    d.update({"ce_dense.x": x, "ce_dense.p": p, "ce_dense.loss": loss, "ce_dense.dx": dx})
    x, t = rand(3, 5).requires_grad_(), rand(3, 5)
    loss = F.mse_loss(x, t)
    (dx,) = torch.autograd.grad(loss, (x,))
    d.update({"mse.x": x, "mse.t": t, "mse.loss": loss, "mse.dx": dx})
    write("softmax_losses", d)


def batchnorm():
    x = rand(4, 3, 5, 5).requires_grad_()
    g = (rand(3) * 0.5 + 1).requires_grad_()
    b = rand(3).requires_grad_()
    rm, rv = rand(3) * 0.1, rand(3).abs() + 0.5
    rm0, rv0 = rm.clone(), rv.clone()
    # MindSpore momentum 0.9 == PyTorch momentum 0.1 (running = 0.9 running + 0.1 batch).
    y = F.batch_norm(x, rm, rv, g, b, training=True, momentum=0.1, eps=1e-5)
    r, (dx, dg, db) = grads_of(y, (x, g, b))
    ye = F.batch_norm(x, rm, rv, g, b, training=False, eps=1e-5)
    write("batchnorm2d", dict(x=x, gamma=g, beta=b, running_mean_in=rm0, running_var_in=rv0, y=y, dy=r, dx=dx,
                              dgamma=dg, dbeta=db, running_mean_out=rm, running_var_out=rv, y_eval=ye))


def formula(shape, a, b, scale):
    """scale * sin(a * i + b) over the flat index i, in float64 then rounded to float32: demi's test computes
    the same values (tests/golden_test.cc), so the fixture need not store them."""
    n = 1
    for s in shape:
        n *= s
    i = torch.arange(n, dtype=torch.float64)
    return (scale * torch.sin(a * i + b)).float().reshape(shape)


def model_a():
    """The seed's SimpleCNN (valid conv), five Momentum(0.01, 0.9) steps from fixed weights, f32."""
    conv = torch.nn.Conv2d(3, 32, 3, bias=False)  # MindSpore's has_bias=False default
    fc = torch.nn.Linear(32 * 15 * 15, 10)
    with torch.no_grad():
        conv.weight.copy_(formula((32, 3, 3, 3), 0.7, 1.0, 0.2))
        fc.weight.copy_(formula((10, 7200), 0.3, 0.5, 0.01))
        fc.bias.copy_(formula((10,), 1.3, 0.2, 0.1))
    net = torch.nn.Sequential(conv, torch.nn.ReLU(), torch.nn.MaxPool2d(2, 2), torch.nn.Flatten(), fc)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for step in range(5):
        x = formula((32, 3, 32, 32), 0.1, float(step), 1.0)
        y = (torch.arange(32) * 3 + step * 7) % 10
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    write("model_a_steps", {"losses": torch.tensor(losses, dtype=torch.float64)})


# ---- Transformer layers (issue 8). Each fixture reseeds, so adding or reordering fixtures above leaves these
# values unchanged; run one alone with
#   /usr/bin/python3 -c 'import sys; sys.path.insert(0, "scripts"); import make_golden as g; g.layernorm()'
# Parameter names are demi's (MindSpore's): PyTorch's LayerNorm weight/bias are demi's gamma/beta; the
# attention weights keep PyTorch's packed layout (in_proj_weight (3E, E), in_proj_bias (3E), out_proj.*),
# which demi's MultiheadAttention uses as is.


def named_grads(module, rename=None):
    rename = rename or {}
    out = {}
    for name, p in module.named_parameters():
        for a, b in rename.items():
            name = name.replace(a, b)
        out[name] = p
    return out


def layernorm():
    torch.manual_seed(808)
    x = rand(3, 4, 8).requires_grad_()
    g = (rand(8) * 0.3 + 1).requires_grad_()
    b = rand(8).requires_grad_()
    y = F.layer_norm(x, (8,), g, b, eps=1e-5)
    r, (dx, dg, db) = grads_of(y, (x, g, b))
    write("layernorm", dict(x=x, gamma=g, beta=b, y=y, dy=r, dx=dx, dgamma=dg, dbeta=db))


def attention_case(prefix, mha, q, kv, attn_mask=None, key_padding_mask=None):
    """One MultiheadAttention call (batch_first) and its gradients, as prefix-named tensors."""
    q = q.clone().requires_grad_()
    kv = q if kv is None else kv.clone().requires_grad_()
    y, _ = mha(q, kv, kv, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False)
    params = named_grads(mha)
    inputs = [q] + ([kv] if kv is not q else []) + list(params.values())
    r, gs = grads_of(y, inputs)
    d = {f"{prefix}.query": q, f"{prefix}.y": y, f"{prefix}.dy": r, f"{prefix}.dquery": gs[0]}
    if kv is not q:
        d.update({f"{prefix}.kv": kv, f"{prefix}.dkv": gs[1]})
    for name, g in zip(params.keys(), gs[len(inputs) - len(params):]):
        d[f"{prefix}.d.{name}"] = g
    return d


def mha():
    """nn.MultiheadAttention(8, 2, batch_first=True) in f64: self-attention plain and masked (a causal float
    attn_mask plus a boolean key padding mask), and cross-attention (query 3 tokens, key = value 5)."""
    torch.manual_seed(809)
    m = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    with torch.no_grad():  # PyTorch zero-initialises the biases; random ones test them
        m.in_proj_bias.copy_(rand(24) * 0.5)
        m.out_proj.bias.copy_(rand(8) * 0.5)
    x = rand(2, 5, 8)
    d = {f"w.{name}": p for name, p in m.named_parameters()}  # the weights, shared by the three cases
    d.update(attention_case("self", m, x, None))
    causal = torch.triu(torch.full((5, 5), float("-inf"), dtype=torch.float64), diagonal=1)
    padding = torch.tensor([[False, False, False, True, True], [False, False, False, False, True]])
    d.update(attention_case("masked", m, x, None, attn_mask=causal, key_padding_mask=padding))
    d["masked.padding"] = padding.long()
    d.update(attention_case("cross", m, rand(2, 3, 8), rand(2, 5, 8)))
    write("mha", d)


def encoder_layer_case(prefix, layer, x, padding=None):
    x = x.clone().requires_grad_()
    y = layer(x, src_key_padding_mask=padding)
    params = named_grads(layer, {"norm1.weight": "norm1.gamma", "norm1.bias": "norm1.beta",
                                 "norm2.weight": "norm2.gamma", "norm2.bias": "norm2.beta"})
    r, gs = grads_of(y, [x] + list(params.values()))
    d = {f"{prefix}.x": x, f"{prefix}.y": y, f"{prefix}.dy": r, f"{prefix}.dx": gs[0]}
    for (name, p), g in zip(params.items(), gs[1:]):
        d[f"{prefix}.{name}"] = p
        d[f"{prefix}.d.{name}"] = g
    return d


def encoder_layer():
    """nn.TransformerEncoderLayer(8, 2, 16, dropout=0, batch_first=True) in f64: post-norm ReLU with a key
    padding mask, and pre-norm GELU."""
    torch.manual_seed(810)
    d = {}
    post = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="relu", batch_first=True).double()
    padding = torch.tensor([[False, False, False, False, True], [False, False, True, True, True]])
    d.update(encoder_layer_case("post", post, rand(2, 5, 8), padding))
    d["post.padding"] = padding.long()
    pre = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True).double()
    with torch.no_grad():
        for n, p in pre.named_parameters():
            if "norm" in n:  # non-trivial gamma and beta
                p.add_(rand(*p.shape) * 0.2)
    d.update(encoder_layer_case("pre", pre, rand(2, 5, 8)))
    write("encoder_layer", d)


def gpt():
    """demi's nn::GPT (nanoGPT's architecture) in f64 under demi's parameter names: vocab 11, context 8, 2
    layers x 2 heads x 8 wide, the output projection tied to wte; logits of ids (2, 6), the mean cross
    entropy against targets, and the gradient of every parameter."""
    torch.manual_seed(1717)
    vocab, block, layers, heads, d = 11, 8, 2, 2, 8
    p = {"wte.embedding_table": rand(vocab, d) * 0.3, "wpe": rand(block, d) * 0.3}
    for i in range(layers):
        h = f"h.{i}."
        p[h + "ln_1.gamma"], p[h + "ln_1.beta"] = 1 + 0.2 * rand(d), 0.2 * rand(d)
        p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"] = 0.3 * rand(3 * d, d), 0.1 * rand(3 * d)
        p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"] = 0.3 * rand(d, d), 0.1 * rand(d)
        p[h + "ln_2.gamma"], p[h + "ln_2.beta"] = 1 + 0.2 * rand(d), 0.2 * rand(d)
        p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"] = 0.3 * rand(4 * d, d), 0.1 * rand(4 * d)
        p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"] = 0.3 * rand(d, 4 * d), 0.1 * rand(d)
    p["ln_f.gamma"], p["ln_f.beta"] = 1 + 0.2 * rand(d), 0.2 * rand(d)
    for t in p.values():
        t.requires_grad_()
    idx = torch.randint(0, vocab, (2, 6))
    targets = torch.randint(0, vocab, (2, 6))
    b, t = idx.shape
    x = p["wte.embedding_table"][idx] + p["wpe"][:t]
    causal = torch.ones(t, t, dtype=torch.bool).triu(1)
    for i in range(layers):
        h = f"h.{i}."
        a = F.layer_norm(x, (d,), p[h + "ln_1.gamma"], p[h + "ln_1.beta"], 1e-5)
        q, k, v = F.linear(a, p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"]).split(d, dim=2)
        q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (d // heads) ** 0.5
        y = F.softmax(att.masked_fill(causal, float("-inf")), dim=-1) @ v
        x = x + F.linear(y.transpose(1, 2).reshape(b, t, d), p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"])
        m = F.layer_norm(x, (d,), p[h + "ln_2.gamma"], p[h + "ln_2.beta"], 1e-5)
        m = F.gelu(F.linear(m, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"]))
        x = x + F.linear(m, p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (d,), p["ln_f.gamma"], p["ln_f.beta"], 1e-5)
    logits = x @ p["wte.embedding_table"].t()
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    gs = torch.autograd.grad(loss, list(p.values()))
    out = {"idx": idx, "targets": targets, "logits": logits, "loss": loss.reshape(1)}
    for (name, t_), g in zip(p.items(), gs):
        out[name] = t_
        out["d." + name] = g
    write("gpt", out)


def basic_block():
    """demi's nn::BasicBlock (ResNet, torchvision's names) in f64, training mode: 4 -> 8 channels, stride 2,
    so the shortcut is the 1x1 convolution + BatchNorm; input (2, 4, 6, 6); output, the input gradient and
    every parameter's gradient for a random output gradient; and AdaptiveAvgPool2d(1) of the output."""
    torch.manual_seed(1818)
    p = {"conv1.weight": rand(8, 4, 3, 3) * 0.3, "bn1.gamma": 1 + 0.2 * rand(8), "bn1.beta": 0.2 * rand(8),
         "conv2.weight": rand(8, 8, 3, 3) * 0.2, "bn2.gamma": 1 + 0.2 * rand(8), "bn2.beta": 0.2 * rand(8),
         "downsample.0.weight": rand(8, 4, 1, 1) * 0.5, "downsample.1.gamma": 1 + 0.2 * rand(8),
         "downsample.1.beta": 0.2 * rand(8)}
    for t in p.values():
        t.requires_grad_()
    x = rand(2, 4, 6, 6).requires_grad_()

    def bn(z, name):
        return F.batch_norm(z, torch.zeros(8, dtype=torch.float64), torch.ones(8, dtype=torch.float64),
                            p[name + ".gamma"], p[name + ".beta"], training=True, momentum=0.1, eps=1e-5)

    y = F.relu(bn(F.conv2d(x, p["conv1.weight"], stride=2, padding=1), "bn1"))
    y = bn(F.conv2d(y, p["conv2.weight"], padding=1), "bn2")
    y = F.relu(y + bn(F.conv2d(x, p["downsample.0.weight"], stride=2), "downsample.1"))
    r, gs = grads_of(y, [x] + list(p.values()))
    out = {"x": x, "y": y, "dy": r, "dx": gs[0], "pooled": F.adaptive_avg_pool2d(y, 1)}
    for (name, t), g in zip(p.items(), gs[1:]):
        out[name] = t
        out["d." + name] = g
    write("basic_block", out)


def optimizers():
    """torch.optim.RMSprop and Adagrad in f64: four steps from fixed weights with fixed gradients, the
    weights after each step. (demi follows MindSpore's formulas; with eps = 1e-10 they agree with PyTorch's
    to far below float32's resolution.)"""
    torch.manual_seed(1919)
    w0 = rand(6)
    grads = [rand(6) for _ in range(4)]
    cases = {
        "rmsprop": lambda p: torch.optim.RMSprop([p], lr=0.01, alpha=0.9, eps=1e-10),
        "rmsprop_momentum_wd": lambda p: torch.optim.RMSprop([p], lr=0.01, alpha=0.9, eps=1e-10, momentum=0.5,
                                                             weight_decay=0.1),
        "rmsprop_centered": lambda p: torch.optim.RMSprop([p], lr=0.01, alpha=0.9, eps=1e-10, momentum=0.5,
                                                          centered=True),
        "adagrad": lambda p: torch.optim.Adagrad([p], lr=0.1, initial_accumulator_value=0.1, eps=1e-10),
        "adagrad_wd": lambda p: torch.optim.Adagrad([p], lr=0.1, initial_accumulator_value=0.1, eps=1e-10,
                                                    weight_decay=0.1),
    }
    out = {"w0": w0}
    for i, g in enumerate(grads):
        out[f"g{i}"] = g
    # LAMB has no torch.optim twin: its paper's update, written out in f64 (lr 0.01, wd 0.1).
    w, m, v = w0.clone(), torch.zeros(6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
    for i, g in enumerate(grads):
        t = i + 1
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        u = (m / (1 - 0.9 ** t)) / ((v / (1 - 0.999 ** t)).sqrt() + 1e-6) + 0.1 * w
        w = w - 0.01 * (w.norm() / u.norm()) * u
        out[f"lamb.w{i}"] = w.clone()
    for name, make in cases.items():
        p = w0.clone().requires_grad_()
        opt = make(p)
        for i, g in enumerate(grads):
            p.grad = g.clone()
            opt.step()
            out[f"{name}.w{i}"] = p.detach().clone()
    write("optimizers", out)


def more_layers():
    """GroupNorm (2 groups of 2 channels, affine), Conv1d (stride 2, padding 1, bias), Softmax and
    LogSoftmax + NLLLoss, in f64: outputs and gradients for a random output gradient (NLLLoss: of the
    mean loss)."""
    torch.manual_seed(2020)
    out = {}
    x, g, b = rand(2, 4, 3, 3).requires_grad_(), (1 + 0.2 * rand(4)).requires_grad_(), (0.2 * rand(4)).requires_grad_()
    y = F.group_norm(x, 2, g, b, eps=1e-5)
    r, (dx, dg, db) = grads_of(y, (x, g, b))
    out.update({"gn.x": x, "gn.gamma": g, "gn.beta": b, "gn.y": y, "gn.dy": r, "gn.dx": dx, "gn.dgamma": dg,
                "gn.dbeta": db})
    x, w, bias = rand(2, 3, 7).requires_grad_(), rand(4, 3, 3).requires_grad_(), rand(4).requires_grad_()
    y = F.conv1d(x, w, bias, stride=2, padding=1)
    r, (dx, dw, db) = grads_of(y, (x, w, bias))
    out.update({"c1.x": x, "c1.w": w, "c1.b": bias, "c1.y": y, "c1.dy": r, "c1.dx": dx, "c1.dw": dw, "c1.db": db})
    x = rand(4, 5).requires_grad_()
    y = F.softmax(x, dim=1)
    r, (dx,) = grads_of(y, (x,))
    out.update({"sm.x": x, "sm.y": y, "sm.dy": r, "sm.dx": dx})
    x = rand(4, 5).requires_grad_()
    labels = torch.tensor([3, 0, 4, 1])
    loss = F.nll_loss(F.log_softmax(x, dim=1), labels)
    (dx,) = torch.autograd.grad(loss, (x,))
    out.update({"nll.x": x, "nll.labels": labels, "nll.loss": loss.reshape(1), "nll.dx": dx})
    write("more_layers", out)


def conv_transpose():
    """Conv2dTranspose in MindSpore's three pad modes, against PyTorch's conv_transpose2d in f64:
    "pad" (2 groups, stride (2, 1), padding (1, 0), output_padding (1, 0), dilation (1, 2), bias);
    "same" (k3 s2: OH = 2H, the convolution's padding (0, 1): PyTorch's full output less its last row and
    column); "valid" (k2 s3, kernel below the stride: OH = 3H, PyTorch's output_padding 1). And
    AdaptiveAvgPool2d with overlapping windows of different sizes (7x5 -> 3x2)."""
    torch.manual_seed(2027)
    out = {}

    def case(prefix, x, w, b, fn):
        x.requires_grad_()
        w.requires_grad_()
        inputs = (x, w) if b is None else (x, w, b.requires_grad_())
        y = fn(*inputs)
        r, gs = grads_of(y, inputs)
        out.update({f"{prefix}.x": x, f"{prefix}.w": w, f"{prefix}.y": y, f"{prefix}.dy": r,
                    f"{prefix}.dx": gs[0], f"{prefix}.dw": gs[1]})
        if b is not None:
            out.update({f"{prefix}.b": b, f"{prefix}.db": gs[2]})

    case("pad", rand(2, 4, 3, 4), rand(4, 3, 3, 2), rand(6),
         lambda x, w, b: F.conv_transpose2d(x, w, b, stride=(2, 1), padding=(1, 0), output_padding=(1, 0),
                                            groups=2, dilation=(1, 2)))
    case("same", rand(2, 3, 4, 5), rand(3, 2, 3, 3), rand(2),
         lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2)[:, :, :8, :10])
    case("valid", rand(1, 2, 3, 2), rand(2, 3, 2, 2), None,
         lambda x, w: F.conv_transpose2d(x, w, stride=3, output_padding=1))
    x = rand(2, 3, 7, 5).requires_grad_()
    y = F.adaptive_avg_pool2d(x, (3, 2))
    r, (dx,) = grads_of(y, (x,))
    out.update({"adaptive.x": x, "adaptive.y": y, "adaptive.dy": r, "adaptive.dx": dx})
    write("conv_transpose", out)


def composite_layers():
    """LeakyReLU (0.2), ELU (0.7, down to x = -40), PReLU (3 channels), L1Loss, SmoothL1Loss (beta 0.5, per element) and
    BCEWithLogitsLoss (logits up to +-30, soft targets) in f64, with their input gradients."""
    torch.manual_seed(2121)
    out = {}
    x = away_from_zero_f64(3, 4).requires_grad_()
    y = F.leaky_relu(x, 0.2)
    r, (dx,) = grads_of(y, (x,))
    out.update({"leaky.x": x, "leaky.y": y, "leaky.dy": r, "leaky.dx": dx})
    x = (rand(3, 4) * 3).requires_grad_()
    with torch.no_grad():
        x[0, 0] = -40.0
    y = F.elu(x, 0.7)
    r, (dx,) = grads_of(y, (x,))
    out.update({"elu.x": x, "elu.y": y, "elu.dy": r, "elu.dx": dx})
    x = away_from_zero_f64(2, 3, 4).requires_grad_()
    w = torch.tensor([0.25, -0.1, 0.6], dtype=torch.float64).requires_grad_()
    y = F.prelu(x, w)
    r, (dx, dw) = grads_of(y, (x, w))
    out.update({"prelu.x": x, "prelu.w": w, "prelu.y": y, "prelu.dy": r, "prelu.dx": dx, "prelu.dw": dw})
    a, t = rand(4, 5).requires_grad_(), rand(4, 5)
    loss = F.l1_loss(a, t)
    (da,) = torch.autograd.grad(loss, (a,))
    out.update({"l1.x": a, "l1.t": t, "l1.loss": loss.reshape(1), "l1.dx": da})
    a = rand(4, 5).requires_grad_()
    y = F.smooth_l1_loss(a, t, reduction="none", beta=0.5)
    r, (da,) = grads_of(y, (a,))
    out.update({"sl1.x": a, "sl1.t": t, "sl1.y": y, "sl1.dy": r, "sl1.dx": da})
    a = (rand(3, 4) * 10).requires_grad_()
    with torch.no_grad():
        a[0, 0], a[0, 1] = 30.0, -30.0
    tb = torch.rand(3, 4, dtype=torch.float64)
    loss = F.binary_cross_entropy_with_logits(a, tb)
    (da,) = torch.autograd.grad(loss, (a,))
    out.update({"bce.x": a, "bce.t": tb, "bce.loss": loss.reshape(1), "bce.dx": da})
    write("composite_layers", out)


def away_from_zero_f64(*shape):
    t = rand(*shape)
    return t + 0.3 * torch.sign(t)


def recurrent():
    """torch.nn.LSTM and GRU (3 -> 4, 2 layers, batch_first) in f64 from given initial states: the output,
    h_n (and c_n), and the gradients of the input and of every parameter for random output gradients."""
    torch.manual_seed(2222)
    out = {}
    for kind in ("lstm", "gru"):
        net = (torch.nn.LSTM if kind == "lstm" else torch.nn.GRU)(3, 4, num_layers=2, batch_first=True).double()
        x = rand(2, 5, 3).requires_grad_()
        h0 = rand(2, 2, 4) * 0.5
        if kind == "lstm":
            c0 = rand(2, 2, 4) * 0.5
            y, (hn, cn) = net(x, (h0, c0))
            out[f"{kind}.c0"], out[f"{kind}.cn"] = c0, cn
        else:
            y, hn = net(x, h0)
        ry, rh = rand(*y.shape), rand(*hn.shape)
        loss = (y * ry).sum() + (hn * rh).sum()
        params = dict(net.named_parameters())
        gs = torch.autograd.grad(loss, [x] + list(params.values()))
        out.update({f"{kind}.x": x, f"{kind}.h0": h0, f"{kind}.y": y, f"{kind}.hn": hn, f"{kind}.ry": ry,
                    f"{kind}.rh": rh, f"{kind}.dx": gs[0]})
        for (name, p), g in zip(params.items(), gs[1:]):
            out[f"{kind}.{name}"] = p
            out[f"{kind}.d.{name}"] = g
    write("recurrent", out)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    if sys.argv[1:]:  # only the named fixtures (each that needs it seeds itself), e.g. make_golden.py gpt
        for name in sys.argv[1:]:
            globals()[name]()
        sys.exit(0)
    dense()
    conv("conv_pad1", 2, 3, 7, 7, 4, 3, 1, 1, 1, 1)
    conv("conv_stride2", 2, 3, 9, 8, 4, 3, 2, 0, 1, 1)
    conv("conv_dilation2", 1, 2, 9, 9, 3, 3, 1, 2, 2, 1)
    conv("conv_groups2", 2, 4, 6, 6, 6, 3, 1, 1, 1, 2, bias=False)
    pools()
    activations()
    softmax_losses()
    batchnorm()
    model_a()
    layernorm()
    mha()
    encoder_layer()
    gpt()
    basic_block()
    optimizers()
    more_layers()
    composite_layers()
    recurrent()
    conv_transpose()
