#!/usr/bin/python3
"""
torch_ckpt.py - adtrain checkpoints on the PyTorch side (Debian's python3-torch, /usr/bin/python3).

  torch_ckpt.py logits CKPT REF [--tol T]
      Loads the parameters of an adtrain checkpoint (adtrain train --save) into the PyTorch model
      described by its "adtrain.model_config" metadata, runs it on the inputs stored in REF
      ("input.ids" for GPT, "input.x" for MLP and VGG, "input.dense" and "input.ids" for DLRM;
      VGG and DLRM through torch.nn modules and load_state_dict(strict=True)) and compares the
      logits with REF's
      "expect.logits". Prints one JSON line {"max_rel_err": ..., "tensors": N}; exit status 1
      when the error is above T (default 1e-5), 2 on a bad file.

  torch_ckpt.py init-traj CFG.json TEXT INIT.safetensors [--batch B] [--steps N] [--lr X]
      Initialises a GPT-2 the way Hugging Face's GPT2LMHeadModel does (normal(0, 0.02), residual
      projections normal(0, 0.02/sqrt(2 n_layer)), LayerNorm 1 and 0, biases 0; seed 0), saves it
      as INIT in Hugging Face's layout ("transformer." prefix, attention-mask buffers, a tied
      lm_head.weight), then trains it in float32 with torch.optim.SGD on the character-level
      windows of TEXT in order (step k uses samples kB..kB+B-1; sample i = bytes [iT, iT+T]) and
      prints the N losses, one JSON array, each taken before its step's update.

The models are the functional ones of gen_fixtures.py (the same names and layouts adtrain uses);
no `safetensors` or `transformers` package is needed.
"""
import argparse
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_fixtures as gf  # noqa: E402

ST_TO_TORCH = {"F32": torch.float32, "F64": torch.float64, "I32": torch.int32, "I64": torch.int64,
               "F16": torch.float16, "BF16": torch.bfloat16, "U8": torch.uint8}


def read_safetensors(path):
    """Returns ({name: tensor}, metadata) of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, d in header.items():
        b, e = d["data_offsets"]
        dt = ST_TO_TORCH[d["dtype"]]
        raw = bytearray(blob[base + b:base + e])
        t = torch.frombuffer(raw, dtype=dt) if raw else torch.zeros(0, dtype=dt)
        out[name] = t.reshape(d["shape"]).clone()
    return out, meta


def mlp_logits(p, x, cfg):
    act = {"relu": F.relu, "gelu": lambda t: F.gelu(t, approximate="tanh"), "sigmoid": torch.sigmoid}
    n = len(cfg["sizes"]) - 1
    for i in range(n):
        x = x @ p[f"layers.{i}.weight"].T + p[f"layers.{i}.bias"]
        if i < n - 1:
            x = act[cfg.get("activation", "relu")](x)
    return x


def module_logits(model, p, *inputs):
    """A torch.nn module whose state_dict names are adtrain's: load_state_dict(strict=True)."""
    model.load_state_dict(p, strict=True)
    model.eval()
    return model(*inputs)


def model_logits(cfg, p, ref):
    if cfg["type"] == "gpt":
        return gf.gpt_forward(p, ref["input.ids"], cfg["n_layer"], cfg["n_head"])
    if cfg["type"] == "mlp":
        return mlp_logits(p, ref["input.x"], cfg)
    if cfg["type"] == "vgg":
        m = gf.VGG(cfg["in_channels"], cfg["height"], cfg["width"], cfg["blocks"], cfg["fc"], cfg["classes"])
        return module_logits(m, p, ref["input.x"])
    if cfg["type"] == "dlrm":
        m = gf.DLRM(cfg["n_dense"], cfg["table_rows"], cfg["emb_dim"], cfg["bottom"], cfg["top"])
        return module_logits(m, p, ref["input.dense"], ref["input.ids"])
    raise SystemExit(f"torch_ckpt.py: model type '{cfg['type']}' is not supported here")


def cmd_logits(args):
    try:
        tensors, meta = read_safetensors(args.ckpt)
        ref, _ = read_safetensors(args.ref)
        cfg = json.loads(meta["adtrain.model_config"])
    except (OSError, KeyError, ValueError) as e:
        print(f"torch_ckpt.py: {e}", file=sys.stderr)
        return 2
    # What PyTorch's load_state_dict(strict=True) would see: the parameters, without adtrain's
    # optimizer state.
    params = {n: t for n, t in tensors.items() if not n.startswith("opt.")}
    with torch.no_grad():
        logits = model_logits(cfg, params, ref)
    want = ref["expect.logits"]
    if logits.shape != want.shape:
        print(f"torch_ckpt.py: logits shape {list(logits.shape)}, expected {list(want.shape)}", file=sys.stderr)
        return 1
    err = ((logits - want).abs() / (want.abs() + 1e-6)).max().item()
    scale_err = ((logits - want).abs().max() / want.abs().max()).item()
    print(json.dumps({"max_rel_err": scale_err, "max_elem_rel_err": err, "tensors": len(params)}))
    return 0 if scale_err <= args.tol else 1


def hf_gpt2_init(cfg):
    V, T, L, C = cfg["vocab_size"], cfg["n_ctx"], cfg["n_layer"], cfg["n_embd"]
    torch.manual_seed(0)
    shapes = [("wte.weight", [V, C]), ("wpe.weight", [T, C])]
    for i in range(L):
        shapes += gf.block_param_shapes(C, f"h.{i}.")
    shapes += [("ln_f.weight", [C]), ("ln_f.bias", [C])]
    p = {}
    for n, s in shapes:
        if n.endswith("ln_1.weight") or n.endswith("ln_2.weight") or n == "ln_f.weight":
            p[n] = torch.ones(s)
        elif n.endswith(".bias"):
            p[n] = torch.zeros(s)
        elif n.endswith("c_proj.weight"):
            p[n] = torch.randn(s) * (0.02 / math.sqrt(2 * L))
        else:
            p[n] = torch.randn(s) * 0.02
    return shapes, p


def cmd_init_traj(args):
    with open(args.cfg) as f:
        cfg = json.load(f)
    with open(args.text, "rb") as f:
        data = f.read()
    vocab = sorted(set(data))
    assert len(vocab) == cfg["vocab_size"], "vocab_size must equal the text's distinct bytes"
    ids_of = {b: i for i, b in enumerate(vocab)}
    tokens = torch.tensor([ids_of[b] for b in data], dtype=torch.int64)
    T, L, H, B = cfg["n_ctx"], cfg["n_layer"], cfg["n_head"], args.batch

    shapes, p = hf_gpt2_init(cfg)
    out = [("transformer." + n, p[n]) for n, _ in shapes]
    causal = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
    out += [(f"transformer.h.{i}.attn.bias", causal) for i in range(L)]
    out += [(f"transformer.h.{i}.attn.masked_bias", torch.tensor(-1e4)) for i in range(L)]
    out += [("lm_head.weight", p["wte.weight"])]
    gf.write_safetensors(args.init, out, {"format": "pt"})

    q = {n: t.clone().requires_grad_(True) for n, t in p.items()}
    opt = torch.optim.SGD([q[n] for n, _ in shapes], lr=args.lr)
    losses = []
    for k in range(args.steps):
        idx = torch.arange(k * B, k * B + B)
        win = torch.stack([tokens[i * T:i * T + T + 1] for i in idx.tolist()])
        opt.zero_grad()
        _, loss = gf.gpt_loss(q, win[:, :-1], win[:, 1:], L, H)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    print(json.dumps(losses))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("logits")
    a.add_argument("ckpt")
    a.add_argument("ref")
    a.add_argument("--tol", type=float, default=1e-5)
    b = sub.add_parser("init-traj")
    b.add_argument("cfg")
    b.add_argument("text")
    b.add_argument("init")
    b.add_argument("--batch", type=int, default=4)
    b.add_argument("--steps", type=int, default=10)
    b.add_argument("--lr", type=float, default=0.1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    return cmd_logits(args) if args.cmd == "logits" else cmd_init_traj(args)


if __name__ == "__main__":
    sys.exit(main())
