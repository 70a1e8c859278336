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

Parameters and inputs are drawn, rounded to float32, and only then widened to float64 for the
reference computation: the stored float32 parameters are exactly the ones the reference used, and
the stored results carry only the final rounding to float32, not float32 accumulation noise.
"""
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


if __name__ == "__main__":
    main()
