#!/usr/bin/python3
"""
gen_fixtures.py - PyTorch reference fixtures for adtrain's tests, as safetensors files.

Run:  make fixtures
      (which is: /usr/bin/python3 scripts/gen_fixtures.py tests/fixtures)
Use Debian's /usr/bin/python3 with python3-torch (1.13); the `safetensors` and `transformers`
packages are not needed: the file format is written by hand below and the model is spelled out.
The output directory is argv[1], tests/fixtures by default. Every file is deterministic
(fixed seeds, float64 reference maths), so re-running rewrites identical bytes.

Files:
  gpt_tiny.safetensors   GPT-2 (V=37, T=16, L=2, C=32, H=4, B=3) in Hugging Face's Conv1D layout:
                         parameters, input.ids/input.targets (I32 [B,T]), expect.logits [B,T,V],
                         expect.loss [], grad.<param> (gradient of the mean loss), and 10-step
                         trajectories traj.sgd.loss [10], traj.adamw.loss [10] (loss before each
                         update, so index 0 is expect.loss), traj.adamw.final.<name> for
                         wte.weight and h.0.attn.c_attn.weight after the 10 AdamW updates.
  gpt_block.safetensors  one pre-LN GPT-2 block on input.x [2,8,32]: blk.<param>, input.dout,
                         expect.y, grad.input.x and grad.blk.<param> for L = sum(y * dout).
  torch_small.safetensors F32, F16, BF16, I32, I64 and U8 tensors, a 0-d and an empty tensor and
                         __metadata__, for the safetensors reader test (values listed below).
  vgg_tiny.safetensors   a VGG-style CNN (2x8x6 images, blocks [[3],[4,5]], fc [7], 3 classes, B=4)
                         as a torch.nn module whose state_dict names are adtrain's (conv{i}.*,
                         fc{j}.*): parameters, input.x [B,C,H,W], input.labels (I32 [B]),
                         expect.logits [B,3], expect.loss [], grad.<param>, traj.sgd.loss [8] (SGD,
                         lr 0.05, momentum 0.9; loss before each update) and traj.sgd.final.<name>
                         for conv0.weight and fc1.weight; __metadata__ holds the configuration and
                         param_count, the module's own parameter count.
  dlrm_tiny.safetensors  DLRM (3 dense, tables of 5/3/7/4 rows, emb_dim 4, bottom [8,4], top
                         [6,1], B=6; ids repeat within the batch) with names emb.{t}.weight,
                         bot.{i}.*, top.{i}.*: parameters, input.dense [B,3], input.ids (I32
                         [B,4]), input.labels [B] (0/1), expect.logits [B], expect.loss [],
                         grad.<param>, traj.sgd.loss [8] and traj.sgd.final.<name> for emb.0.weight
                         and top.0.weight; __metadata__ as above, table_rows comma-separated.
  dlrm_wide.safetensors  the same layout for 40 tables (emb_dim 2, B=3): more feature vectors than
                         one concatenation takes, so the grouped join of the interaction input is
                         checked too.

Parameters and inputs are drawn, rounded to float32, and only then widened to float64 for the
reference computation: the stored float32 parameters are exactly the ones the reference used, and
the stored results carry only the final rounding to float32, not float32 accumulation noise.
"""
import copy
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

assert sys.byteorder == "little", "safetensors data is little-endian"

ST_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    # numpy has no bfloat16: reinterpret the 16-bit patterns instead.
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, torch tensor), written back to back in that order."""
    header = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    blobs = []
    offset = 0
    for name, t in tensors:
        assert name not in header, f"duplicate tensor name {name}"
        b = tensor_bytes(t)
        header[name] = {
            "dtype": ST_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(b)],
        }
        blobs.append(b)
        offset += len(b)
    hdr = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hdr += b" " * (-len(hdr) % 8)  # the spec's padding: data starts 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)))
        f.write(hdr)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
    return os.path.getsize(path)


def f32(t):
    """Rounds to float32 (what the file stores) and widens back for the float64 reference."""
    return t.to(torch.float32).to(torch.float64)


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------
# GPT-2, written out. Linear layers are HF Conv1D: y = x @ W + b with W [in, out].
def layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)  # biased variance, as nn.LayerNorm
    return (x - mu) / torch.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(x, p, pre, n_head):
    B, T, C = x.shape
    hd = C // n_head
    qkv = x @ p[pre + "c_attn.weight"] + p[pre + "c_attn.bias"]
    q, k, v = qkv.split(C, dim=-1)  # q | k | v along the output axis
    q, k, v = (t.view(B, T, n_head, hd).transpose(1, 2) for t in (q, k, v))
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, C)
    return y @ p[pre + "c_proj.weight"] + p[pre + "c_proj.bias"]


def mlp(x, p, pre):
    h = gelu_tanh(x @ p[pre + "c_fc.weight"] + p[pre + "c_fc.bias"])
    return h @ p[pre + "c_proj.weight"] + p[pre + "c_proj.bias"]


def block(x, p, pre, n_head):
    x = x + attention(layer_norm(x, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"]), p,
                      pre + "attn.", n_head)
    x = x + mlp(layer_norm(x, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"]), p, pre + "mlp.")
    return x


def gpt_forward(p, ids, n_layer, n_head):
    T = ids.shape[1]
    x = p["wte.weight"][ids.long()] + p["wpe.weight"][:T]
    for i in range(n_layer):
        x = block(x, p, f"h.{i}.", n_head)
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
    return x @ p["wte.weight"].T  # LM head tied to the token embedding


def gpt_loss(p, ids, targets, n_layer, n_head):
    logits = gpt_forward(p, ids, n_layer, n_head)
    V = logits.shape[-1]
    return logits, F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1).long())


def block_param_shapes(C, pre):
    return [
        (pre + "ln_1.weight", [C]), (pre + "ln_1.bias", [C]),
        (pre + "attn.c_attn.weight", [C, 3 * C]), (pre + "attn.c_attn.bias", [3 * C]),
        (pre + "attn.c_proj.weight", [C, C]), (pre + "attn.c_proj.bias", [C]),
        (pre + "ln_2.weight", [C]), (pre + "ln_2.bias", [C]),
        (pre + "mlp.c_fc.weight", [C, 4 * C]), (pre + "mlp.c_fc.bias", [4 * C]),
        (pre + "mlp.c_proj.weight", [4 * C, C]), (pre + "mlp.c_proj.bias", [C]),
    ]


def init_param(name, shape, weight_std, proj_std):
    """GPT-2 init, then biases and LayerNorm parameters moved off 0/1 by N(0, 0.1) noise so
    that a test cannot pass while ignoring them."""
    if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
        return f32(1.0 + 0.1 * randn(*shape))
    if name.endswith(".bias"):
        return f32(0.1 * randn(*shape))
    if name.endswith("c_proj.weight"):
        return f32(proj_std * randn(*shape))
    return f32(weight_std * randn(*shape))


def gen_gpt_tiny(out_dir):
    V, T, L, C, H, B = 37, 16, 2, 32, 4, 3
    torch.manual_seed(1234)
    shapes = [("wte.weight", [V, C]), ("wpe.weight", [T, C])]
    for i in range(L):
        shapes += block_param_shapes(C, f"h.{i}.")
    shapes += [("ln_f.weight", [C]), ("ln_f.bias", [C])]
    params = {n: init_param(n, s, 0.02, 0.02 / math.sqrt(2 * L)) for n, s in shapes}
    ids = torch.randint(0, V, (B, T), dtype=torch.int32)
    targets = torch.randint(0, V, (B, T), dtype=torch.int32)

    p = {n: t.clone().requires_grad_(True) for n, t in params.items()}
    logits, loss = gpt_loss(p, ids, targets, L, H)
    loss.backward()
    grads = {n: p[n].grad.clone() for n, _ in shapes}

    def trajectory(make_opt):
        q = {n: t.clone().requires_grad_(True) for n, t in params.items()}
        opt = make_opt([q[n] for n, _ in shapes])
        losses = []
        for _ in range(10):
            opt.zero_grad()
            _, l = gpt_loss(q, ids, targets, L, H)
            losses.append(l.item())  # before this step's update
            l.backward()
            opt.step()
        return torch.tensor(losses, dtype=torch.float64), q

    sgd_loss, _ = trajectory(lambda ps: torch.optim.SGD(ps, lr=0.1))
    # One parameter group: weight decay applies to every parameter, biases and LN included.
    adamw_loss, q = trajectory(lambda ps: torch.optim.AdamW(
        ps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01))

    out = [(n, params[n].float()) for n, _ in shapes]
    out += [("input.ids", ids), ("input.targets", targets),
            ("expect.logits", logits.detach().float()), ("expect.loss", loss.detach().float())]
    out += [("grad." + n, grads[n].float()) for n, _ in shapes]
    out += [("traj.sgd.loss", sgd_loss.float()), ("traj.adamw.loss", adamw_loss.float())]
    out += [("traj.adamw.final." + n, q[n].detach().float())
            for n in ("wte.weight", "h.0.attn.c_attn.weight")]
    meta = {"model": "gpt2", "vocab_size": str(V), "n_ctx": str(T), "n_layer": str(L),
            "n_embd": str(C), "n_head": str(H), "batch": str(B)}
    path = os.path.join(out_dir, "gpt_tiny.safetensors")
    return path, write_safetensors(path, out, meta), loss.item()


def gen_gpt_block(out_dir):
    B, T, C, H = 2, 8, 32, 4
    torch.manual_seed(5678)
    shapes = block_param_shapes(C, "blk.")
    # Weights at std 1/sqrt(fan_in) rather than 0.02, so attention scores are O(1) and the
    # softmax is far from uniform: a wrong scale, mask or head split changes the result.
    params = {}
    for n, s in shapes:
        std = 1.0 / math.sqrt(s[0]) if len(s) == 2 else 0.0
        params[n] = init_param(n, s, std, std)
    x = f32(randn(B, T, C))
    dout = f32(randn(B, T, C))

    p = {n: t.clone().requires_grad_(True) for n, t in params.items()}
    xg = x.clone().requires_grad_(True)
    y = block(xg, p, "blk.", H)
    (y * dout).sum().backward()

    out = [(n, params[n].float()) for n, _ in shapes]
    out += [("input.x", x.float()), ("input.dout", dout.float()), ("expect.y", y.detach().float()),
            ("grad.input.x", xg.grad.float())]
    out += [("grad." + n, p[n].grad.float()) for n, _ in shapes]
    meta = {"n_embd": str(C), "n_head": str(H), "batch": str(B), "seq": str(T)}
    path = os.path.join(out_dir, "gpt_block.safetensors")
    return path, write_safetensors(path, out, meta), y.abs().max().item()


# ---------------------------------------------------------------------------------------------
# VGG-style CNN and DLRM as torch.nn modules whose state_dict names are adtrain's.
class VGG(torch.nn.Module):
    def __init__(self, in_channels, height, width, blocks, fc, classes):
        super().__init__()
        self.blocks = blocks
        ci, k = in_channels, 0
        for block in blocks:
            for co in block:
                setattr(self, f"conv{k}", torch.nn.Conv2d(ci, co, 3, stride=1, padding=1))
                ci, k = co, k + 1
        n_in = ci * (height >> len(blocks)) * (width >> len(blocks))
        self.n_fc = len(fc) + 1
        for j, out in enumerate(fc + [classes]):
            setattr(self, f"fc{j}", torch.nn.Linear(n_in, out))
            n_in = out

    def forward(self, x):
        k = 0
        for block in self.blocks:
            for _ in block:
                x = F.relu(getattr(self, f"conv{k}")(x))
                k += 1
            x = F.max_pool2d(x, 2, 2)
        x = torch.flatten(x, 1)
        for j in range(self.n_fc):
            x = getattr(self, f"fc{j}")(x)
            if j + 1 < self.n_fc:
                x = F.relu(x)
        return x


class DLRM(torch.nn.Module):
    """facebookresearch/dlrm's DLRM_Net with the "dot" interaction (no self-interaction): ReLU
    after every bottom layer, ReLU between top layers, the last sigmoid left to the loss."""

    def __init__(self, n_dense, table_rows, emb_dim, bottom, top):
        super().__init__()
        self.bot = torch.nn.ModuleList()
        n_in = n_dense
        for w in bottom:
            self.bot.append(torch.nn.Linear(n_in, w))
            n_in = w
        self.emb = torch.nn.ModuleList()
        for rows in table_rows:  # DLRM's create_emb: U(-sqrt(1/n), sqrt(1/n))
            e = torch.nn.Embedding(rows, emb_dim)
            torch.nn.init.uniform_(e.weight, -math.sqrt(1.0 / rows), math.sqrt(1.0 / rows))
            self.emb.append(e)
        nf = len(table_rows) + 1
        n_in = emb_dim + nf * (nf - 1) // 2
        self.top = torch.nn.ModuleList()
        for w in top:
            self.top.append(torch.nn.Linear(n_in, w))
            n_in = w

    def forward(self, dense, ids):
        x = dense
        for layer in self.bot:
            x = F.relu(layer(x))
        ly = [e(ids[:, t].long()) for t, e in enumerate(self.emb)]
        B, d = x.shape
        T = torch.cat([x] + ly, dim=1).view(B, -1, d)
        Z = torch.bmm(T, torch.transpose(T, 1, 2))
        nf = T.shape[1]
        li = torch.tensor([i for i in range(nf) for j in range(i)])
        lj = torch.tensor([j for i in range(nf) for j in range(i)])
        R = torch.cat([x, Z[:, li, lj]], dim=1)
        for k, layer in enumerate(self.top):
            R = layer(R)
            if k + 1 < len(self.top):
                R = F.relu(R)
        return R.squeeze(1)


def module_fixture(path, model, inputs, labels, loss_fn, finals, meta, steps=8, lr=0.05, momentum=0.9):
    """model: a float32-initialised module (its values are what the file stores), run in float64.
    inputs: list of (fixture name, tensor) fed to model(*tensors); labels: (name, tensor), stored.
    loss_fn(logits, labels) -> mean loss, in the logits' dtype.
    Writes parameters, inputs, expect.*, grad.* and an SGD trajectory; returns the file size and
    the worst relative drift of the same trajectory run in float32 (how close float32 can get)."""
    # Biases made positive: a tiny network at its default init has many ReLUs dead for the whole
    # batch, whose weights would then be checked only against a zero gradient.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.abs_()
    names = [n for n, _ in model.named_parameters()]
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    meta = dict(meta, param_count=str(sum(p.numel() for p in model.parameters())))
    args = [t.double() if t.is_floating_point() else t for _, t in inputs]

    def run(dtype):
        m = copy.deepcopy(model).to(dtype)
        a = [t.to(dtype) if t.is_floating_point() else t for _, t in inputs]
        opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum)
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            loss = loss_fn(m(*a), labels[1])
            losses.append(loss.item())  # before this step's update
            loss.backward()
            opt.step()
        return torch.tensor(losses, dtype=torch.float64), dict(m.named_parameters())

    m = copy.deepcopy(model).double()
    logits = m(*args)
    loss = loss_fn(logits, labels[1])
    loss.backward()
    traj, final = run(torch.float64)
    traj32, _ = run(torch.float32)
    drift = ((traj32 - traj).abs() / traj.abs()).max().item()

    out = [(n, start[n].float()) for n in names]
    out += list(inputs) + [labels]
    out += [("expect.logits", logits.detach().float()), ("expect.loss", loss.detach().float())]
    out += [("grad." + n, p.grad.float()) for n, p in m.named_parameters()]
    out += [("traj.sgd.loss", traj.float())]
    out += [("traj.sgd.final." + n, final[n].detach().float()) for n in finals]
    return write_safetensors(path, out, meta), drift


def gen_vgg_tiny(out_dir):
    C, H, W, blocks, fc, classes, B = 2, 8, 6, [[3], [4, 5]], [7], 3, 4
    torch.manual_seed(2468)
    model = VGG(C, H, W, blocks, fc, classes)
    x = torch.randn(B, C, H, W, dtype=torch.float32)
    labels = torch.randint(0, classes, (B,), dtype=torch.int32)
    meta = {"model": "vgg", "in_channels": str(C), "height": str(H), "width": str(W),
            "blocks": json.dumps(blocks), "fc": json.dumps(fc), "classes": str(classes), "batch": str(B)}
    path = os.path.join(out_dir, "vgg_tiny.safetensors")
    size, drift = module_fixture(path, model, [("input.x", x)], ("input.labels", labels),
                                 lambda z, y: F.cross_entropy(z, y.long()),
                                 ["conv0.weight", "fc1.weight"], meta)
    return path, size, drift


def dlrm_fixture(out_dir, file, seed, n_dense, table_rows, emb_dim, bottom, top, B, finals):
    torch.manual_seed(seed)
    model = DLRM(n_dense, table_rows, emb_dim, bottom, top)
    dense = torch.randn(B, n_dense, dtype=torch.float32)
    ids = torch.stack([torch.randint(0, r, (B,), dtype=torch.int32) for r in table_rows], dim=1)
    labels = torch.randint(0, 2, (B,)).to(torch.float32)
    meta = {"model": "dlrm", "n_dense": str(n_dense), "table_rows": ",".join(map(str, table_rows)),
            "emb_dim": str(emb_dim), "bottom": json.dumps(bottom), "top": json.dumps(top),
            "batch": str(B)}
    path = os.path.join(out_dir, file)
    size, drift = module_fixture(
        path, model, [("input.dense", dense), ("input.ids", ids)], ("input.labels", labels),
        lambda z, y: F.binary_cross_entropy_with_logits(z, y.to(z.dtype)), finals, meta)
    return path, size, drift


def gen_dlrm_tiny(out_dir):
    return dlrm_fixture(out_dir, "dlrm_tiny.safetensors", 1357, 3, [5, 3, 7, 4], 4, [8, 4], [6, 1], 6,
                        ["emb.0.weight", "top.0.weight"])


def gen_dlrm_wide(out_dir):
    return dlrm_fixture(out_dir, "dlrm_wide.safetensors", 9753, 2, [2 + t % 3 for t in range(40)], 2,
                        [2], [3, 1], 3, ["emb.39.weight", "top.0.weight"])


def gen_torch_small(out_dir):
    # Exact values, all representable in their dtypes; tests/test_safetensors.c checks them.
    out = [
        ("f32", torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5 - 1.0),
        ("f16", torch.tensor([1.0, -0.5, 65504.0, 2.0 ** -24], dtype=torch.float16)),
        ("bf16", torch.tensor([1.0, -2.5, 3.140625, -0.0078125], dtype=torch.bfloat16)),
        ("i32", torch.tensor([[1, -2], [3, -4], [5, 2147483647]], dtype=torch.int32)),
        ("i64", torch.tensor([-(2 ** 40), 0, 2 ** 40 + 7, 2 ** 62], dtype=torch.int64)),
        ("u8", torch.tensor([0, 127, 255], dtype=torch.uint8)),
        ("scalar", torch.tensor(3.5, dtype=torch.float32)),
        ("empty", torch.zeros(0, 4, dtype=torch.float32)),
    ]
    path = os.path.join(out_dir, "torch_small.safetensors")
    return path, write_safetensors(path, out, {"format": "pt", "note": "torch_small"}), None


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)  # reductions in a fixed order, run to run
    for gen in (gen_gpt_tiny, gen_gpt_block, gen_torch_small):
        path, size, note = gen(out_dir)
        extra = f"  ({note:.6f})" if note is not None else ""
        print(f"wrote {path}: {size} bytes{extra}")
    for gen in (gen_vgg_tiny, gen_dlrm_tiny, gen_dlrm_wide):
        path, size, drift = gen(out_dir)
        print(f"wrote {path}: {size} bytes  (float32 PyTorch trajectory drift {drift:.2e})")


if __name__ == "__main__":
    main()
