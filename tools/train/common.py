"""Shared pieces of blockspec's drafter training (tools/train/): safetensors I/O, the stories260K
target as a small torch Llama, RoPE, seeding, the time look-up table of FlashMap.

Only torch and numpy are needed (Debian's python3 has no `safetensors`/`transformers`), so the same
code runs on the CPU here and on the GPU machine. Safetensors are written by hand (the layout:
tools/reference/safetensors_io.py): u64 LE header length, JSON header {name: {dtype, shape,
data_offsets}}, raw little-endian bytes.
"""

import hashlib
import json
import math
import os
import random
import signal
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
# The .safetensors file layout (not model code) is shared with the references.
sys.path.insert(0, os.path.join(REPO, "tools", "reference"))
import safetensors_io  # noqa: E402
TARGET_DIR = os.path.join(REPO, "models", "stories260K")

# ---------------------------------------------------------------------------------------------
# misc
# ---------------------------------------------------------------------------------------------


def seed_all(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def setup_device(name):
    dev = torch.device(name)
    if dev.type == "cpu":
        # The development machine's cores are shared: one thread unless asked otherwise.
        torch.set_num_threads(int(os.environ.get("BS_TRAIN_THREADS", "1")))
    if dev.type == "cuda":
        # Exact fp32 GEMMs: the exported weights are compared against fp32 references.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return dev


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


class Log:
    """print with elapsed seconds; flushes (the device run tees stdout)."""

    def __init__(self, tag):
        self.tag = tag
        self.t0 = time.time()

    def __call__(self, *a):
        print("[%s %7.1fs]" % (self.tag, time.time() - self.t0), *a, flush=True)


def load_data(path):
    """data.pt of data.py (torch 1.13 and 2.x)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except TypeError:
        return torch.load(path, map_location="cpu")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cosine_lr(progress, peak, warmup_frac=0.04):
    """Linear warmup over the first warmup_frac of training, then cosine to 0 (progress in [0,1])."""
    if progress < warmup_frac:
        return peak * max(progress, 1e-3) / warmup_frac
    prog = min(1.0, (progress - warmup_frac) / (1.0 - warmup_frac))
    return peak * 0.5 * (1.0 + math.cos(math.pi * prog))


class Schedule:
    """Training progress in [0, 1] = max(step / steps, elapsed / seconds): the run ends after
    `steps` optimiser steps or `seconds` of wall time, whichever comes first, and the cosine
    schedule always reaches 0 at the end (seconds <= 0: steps only)."""

    def __init__(self, steps, seconds=0.0):
        self.steps, self.seconds = steps, seconds
        self.t0 = time.time()

    def progress(self, step):
        p = step / self.steps
        if self.seconds > 0:
            p = max(p, (time.time() - self.t0) / self.seconds)
        return p


# ---------------------------------------------------------------------------------------------
# The shared training driver of the DFlash-family trainers (dflash.py, dspark.py, dflash2.py)
# ---------------------------------------------------------------------------------------------


def add_train_args(ap, block_size, gamma, inter=256, lr=3e-3, steps=6000):
    """The arguments every DFlash-family trainer takes (defaults per family)."""
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=block_size)
    ap.add_argument("--taps", default="1,2,3", help="target layers (residual after them)")
    ap.add_argument("--inter", type=int, default=inter)
    ap.add_argument("--mask-token-id", type=int, default=0)
    ap.add_argument("--gamma", type=float, default=gamma, help="position decay of the row weights")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--wd", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--time-budget", type=float, default=0.0,
                    help="seconds of wall time; the run and its cosine schedule end at whichever of "
                         "--steps / --time-budget comes first (0 = steps only)")
    ap.add_argument("--val", type=int, default=256, help="held-out training sequences")
    ap.add_argument("--log-every", type=int, default=200)


class StopFlag:
    """Set by SIGTERM / SIGINT (e.g. `timeout`): the training loop then stops early and still
    validates and exports what it has."""

    def __init__(self):
        self.stop = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._set)

    def _set(self, signum, frame):
        self.stop = True


def setup_training(a, tag):
    """Log, device, seeds, the target and the token data split into (train, val)."""
    log = Log(tag)
    dev = setup_device(a.device)
    seed_all(a.seed)
    target = Target(device=dev)
    toks = load_data(a.data)["tokens"].long().to(dev)
    taps = [int(x) for x in a.taps.split(",")]
    return log, dev, target, toks[a.val:], toks[:a.val], taps


def train_loop(a, model, toks, step_loss, log, describe):
    """AdamW (beta 0.9/0.95), warmup 4 % + cosine to 0 over common.Schedule(--steps,
    --time-budget), grad clip 1.0. Each step draws --batch rows of toks (with the generator seeded
    by --seed) and calls step_loss(rows, gen) -> (loss, stats); describe(stats) is appended to the
    log line every --log-every steps. Returns the number of steps taken."""
    dev = toks.device
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=a.wd)
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    stop = StopFlag()
    sched = Schedule(a.steps, a.time_budget)
    step = 0
    while not stop.stop:
        prog = sched.progress(step)
        if prog >= 1.0:
            break
        lr = cosine_lr(prog, a.lr)
        for gr in opt.param_groups:
            gr["lr"] = lr
        idx = torch.randint(0, toks.shape[0], (a.batch,), generator=gen, device=dev)
        loss, stats = step_loss(toks[idx], gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % a.log_every == 0:
            log("step %5d (%.0f%%) lr %.2e loss %.4f gnorm %.2f %s" % (
                step, 100 * prog, lr, loss.item(), gn.item(), describe(stats)))
        step += 1
    if stop.stop:
        log("stopped by a signal after %d steps: validating and exporting what there is" % step)
    return step


class ParamModule(torch.nn.Module):
    """A drafter whose parameters live in self.P (an nn.ParameterDict) under their checkpoint
    names with '.' spelled '__'."""

    def w(self, name):
        return self.P[name.replace(".", "__")]

    def state_dict_export(self):
        return {k.replace("__", "."): v.detach().float().cpu().contiguous()
                for k, v in self.P.items()}

    def load_export(self, sd):
        for k, v in sd.items():
            p = self.P[k.replace(".", "__")]
            p.data.copy_(v.reshape(p.shape))


def draw(z, temp, gen, qs):
    """One drafted token per row of z [N, V]: the argmax at temp 0 (first index on ties), else a
    draw from q = softmax(z / temp), appended to qs (the proposal of the rejection step)."""
    if temp == 0:
        return z.argmax(-1)
    q = torch.softmax(z / temp, -1)
    qs.append(q)
    return torch.multinomial(q, 1, generator=gen)[:, 0]


def fmt_list(xs, fmt="%.3f"):
    return " ".join(fmt % x for x in (xs.tolist() if hasattr(xs, "tolist") else xs))


def write_train_log(out_dir, a, **fields):
    with open(os.path.join(out_dir, "train_log.json"), "w") as f:
        json.dump(dict({"args": vars(a)}, **fields), f, indent=1)


# ---------------------------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------------------------

_NP = {"F32": "<f4", "F16": "<f2", "I32": "<i4", "I64": "<i8", "U8": "u1", "U16": "<u2"}


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: torch.Tensor or np.ndarray} (F32/I32/I64/U16 by dtype). Tensors are laid out in
    name order; every dtype used here is 4 or 8 bytes, I64 first, so offsets stay aligned."""
    items = []
    for name, t in tensors.items():
        a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        if a.dtype == np.float32 or a.dtype == np.float64:
            dt, a = "F32", a.astype("<f4")
        elif a.dtype == np.int64:
            dt, a = "I64", a.astype("<i8")
        elif a.dtype == np.int32:
            dt, a = "I32", a.astype("<i4")
        elif a.dtype == np.uint16:
            dt, a = "U16", a.astype("<u2")
        else:
            raise ValueError("%s: unsupported dtype %s" % (name, a.dtype))
        items.append((name, dt, list(a.shape), np.ascontiguousarray(a).tobytes(), a.itemsize))
    items.sort(key=lambda x: (-x[4], x[0]))
    safetensors_io.write_raw(path, [it[:4] for it in items], metadata)


def read_safetensors(path):
    """{name: torch.Tensor} (F32, F16, BF16 -> float32; integer types kept)."""
    out = {}
    for name, (dt, shape, raw) in safetensors_io.read_raw(path)[0].items():
        if dt == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            a = bits.view(np.float32)
        else:
            a = np.frombuffer(raw, dtype=_NP[dt])
        a = a.reshape(shape).copy()
        if a.dtype == np.float16:
            a = a.astype(np.float32)
        if a.dtype == np.uint16:
            a = a.astype(np.int32)
        out[name] = torch.from_numpy(a)
    return out


# ---------------------------------------------------------------------------------------------
# RoPE (neox rotate-half, as HF Llama / Qwen3)
# ---------------------------------------------------------------------------------------------


def rope_inv_freq(head_dim, theta, device):
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float().to(device)
                            / head_dim))


def rope(x, pos, inv_freq):
    """x [..., T, heads, d]; pos broadcastable to [..., T] (int). Rotate-half RoPE in fp32."""
    ang = pos.float()[..., None] * inv_freq  # [..., T, d/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[..., None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[..., None, :]
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def sdpa(q, k, v, mask=None, causal=False):
    """q [N, h, T, d], k/v [N, h, S, d]; mask: bool [.., T, S] (True = visible)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and
                                              mask is None)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal and mask is None:
        T, S = q.shape[-2], k.shape[-2]
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


# ---------------------------------------------------------------------------------------------
# The target: stories260K (HF Llama layout) in plain torch
# ---------------------------------------------------------------------------------------------


class Target:
    """Frozen fp32 Llama (models/stories260K). forward() returns logits and the residual stream
    after every layer (res[i] = HF hidden_states[i+1] for i < n_layers-1; the last entry is the
    raw residual, before the final norm)."""

    def __init__(self, target_dir=TARGET_DIR, device="cpu"):
        with open(os.path.join(target_dir, "config.json")) as f:
            self.cfg = c = json.load(f)
        sd = read_safetensors(os.path.join(target_dir, "model.safetensors"))
        self.dev = torch.device(device)
        self.w = {k: v.float().to(self.dev) for k, v in sd.items()}
        self.H = c["hidden_size"]
        self.n_layers = c["num_hidden_layers"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c["num_key_value_heads"]
        self.hd = c.get("head_dim") or self.H // self.heads
        self.V = c["vocab_size"]
        self.eps = c["rms_norm_eps"]
        self.embed = self.w["model.embed_tokens.weight"]
        self.lm_head = self.w.get("lm_head.weight", self.embed)
        self.inv_freq = rope_inv_freq(self.hd, c.get("rope_theta", 10000.0), self.dev)
        self.bos = c.get("bos_token_id", 1)

    def _layer(self, i, h, pos, cache=None, mask=None):
        p = "model.layers.%d." % i
        w = self.w
        N, T, _ = h.shape
        x = rms_norm(h, w[p + "input_layernorm.weight"], self.eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(N, T, self.heads, self.hd)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(N, T, self.kv_heads, self.hd)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(N, T, self.kv_heads, self.hd)
        q = rope(q, pos, self.inv_freq).transpose(1, 2)
        k = rope(k, pos, self.inv_freq).transpose(1, 2)
        v = v.transpose(1, 2)
        if cache is not None:
            if i in cache:
                k = torch.cat([cache[i][0], k], 2)
                v = torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
        g = self.heads // self.kv_heads
        k = k.repeat_interleave(g, 1)
        v = v.repeat_interleave(g, 1)
        if cache is not None and T == 1:
            a = sdpa(q, k, v)
        else:
            a = sdpa(q, k, v, mask=mask, causal=mask is None)
        a = a.transpose(1, 2).reshape(N, T, self.heads * self.hd)
        h = h + a @ w[p + "self_attn.o_proj.weight"].T
        y = rms_norm(h, w[p + "post_attention_layernorm.weight"], self.eps)
        m = F.silu(y @ w[p + "mlp.gate_proj.weight"].T) * (y @ w[p + "mlp.up_proj.weight"].T)
        return h + m @ w[p + "mlp.down_proj.weight"].T

    @torch.no_grad()
    def forward(self, ids, pos0=0, cache=None, taps=None):
        """ids [N, T] at positions pos0..pos0+T-1 (cache: dict reused across calls for incremental
        decoding). Returns logits [N, T, V] and, if taps is a list of layer ids, the concatenation
        of the residuals after those layers [N, T, len(taps)*H]."""
        N, T = ids.shape
        pos = torch.arange(pos0, pos0 + T, device=self.dev)
        h = self.embed[ids]
        feats = {}
        for i in range(self.n_layers):
            h = self._layer(i, h, pos, cache)
            if taps is not None and i in taps:
                feats[i] = h
        out = rms_norm(h, self.w["model.norm.weight"], self.eps)
        logits = out @ self.lm_head.T
        if taps is None:
            return logits
        return logits, torch.cat([feats[i] for i in taps], -1)


    # -- per-row positions over a fixed-size KV buffer (speculative evaluation) --

    def new_cache(self, N, L):
        """K/V buffers [N, L, kv_heads, hd] per layer, written at explicit positions."""
        z = lambda: torch.zeros(N, L, self.kv_heads, self.hd, device=self.dev)  # noqa: E731
        return [(z(), z()) for _ in range(self.n_layers)]

    @torch.no_grad()
    def forward_rows(self, ids, pos, kv, taps=None):
        """ids, pos [N, T] (row n's tokens at absolute positions pos[n]); writes their K/V into kv
        at those positions, then attends causally over the buffer (key j visible to a query at
        position q iff j <= q). Entries above a row's current positions are stale but never read
        before being rewritten, as long as each call starts at the row's first unverified
        position. Returns logits [N, T, V] (and taps [N, T, n*H])."""
        w = self.w
        N, T = ids.shape
        L = kv[0][0].shape[1]
        rows = torch.arange(N, device=self.dev)[:, None]
        vis = torch.arange(L, device=self.dev)[None, None, :] <= pos[:, :, None]  # [N, T, L]
        bias = torch.zeros(N, 1, T, L, device=self.dev).masked_fill(~vis[:, None],
                                                                   float("-inf"))
        g = self.heads // self.kv_heads
        h = self.embed[ids]
        feats = {}
        for i in range(self.n_layers):
            p = "model.layers.%d." % i
            x = rms_norm(h, w[p + "input_layernorm.weight"], self.eps)
            q = rope((x @ w[p + "self_attn.q_proj.weight"].T).view(N, T, self.heads, self.hd),
                     pos, self.inv_freq)
            k = rope((x @ w[p + "self_attn.k_proj.weight"].T).view(N, T, self.kv_heads, self.hd),
                     pos, self.inv_freq)
            v = (x @ w[p + "self_attn.v_proj.weight"].T).view(N, T, self.kv_heads, self.hd)
            K, V = kv[i]
            K[rows, pos] = k
            V[rows, pos] = v
            Kh = K.repeat_interleave(g, 2).permute(0, 2, 3, 1)  # [N, h, d, L]
            Vh = V.repeat_interleave(g, 2).transpose(1, 2)  # [N, h, L, d]
            s = (q.transpose(1, 2) @ Kh) / math.sqrt(self.hd) + bias
            a = (torch.softmax(s, -1) @ Vh).transpose(1, 2).reshape(N, T, self.heads * self.hd)
            h = h + a @ w[p + "self_attn.o_proj.weight"].T
            y = rms_norm(h, w[p + "post_attention_layernorm.weight"], self.eps)
            m = F.silu(y @ w[p + "mlp.gate_proj.weight"].T) * (y @ w[p + "mlp.up_proj.weight"].T)
            h = h + m @ w[p + "mlp.down_proj.weight"].T
            if taps is not None and i in taps:
                feats[i] = h
        logits = rms_norm(h, w["model.norm.weight"], self.eps) @ self.lm_head.T
        if taps is None:
            return logits
        return logits, torch.cat([feats[i] for i in taps], -1)


# ---------------------------------------------------------------------------------------------
# FlashMap time reparameterisation (flashmap.md §2): alpha(gamma) = K/(K-1) (q(gamma) - 1/K),
# q(gamma) = E_z[Phi(z + gamma/(1-gamma))^(K-1)], K = vocab size.
# ---------------------------------------------------------------------------------------------


class TimeLUT:
    def __init__(self, K, n=20001):
        g = np.linspace(0.0, 1.0, n)[:-1]
        z, wq = np.polynomial.hermite_e.hermegauss(160)  # weight exp(-z^2/2)
        wq = wq / wq.sum()
        shift = torch.tensor(g / (1.0 - g), dtype=torch.float64)[:, None]
        zz = torch.tensor(z, dtype=torch.float64)[None, :]
        phi = 0.5 * (1.0 + torch.erf((zz + shift) / math.sqrt(2.0)))
        q = (phi.clamp_min(1e-300).log() * (K - 1)).exp() @ torch.tensor(wq, dtype=torch.float64)
        q = q.numpy()
        alpha = K / (K - 1.0) * (q - 1.0 / K)
        alpha = np.maximum.accumulate(np.clip(alpha, 0.0, 1.0))
        self.g = np.append(g, 1.0)
        self.a = np.append(alpha, 1.0)
        self.a[0] = 0.0

    def gamma(self, alpha):
        """alpha in [0, 1] (array) -> gamma."""
        return np.interp(alpha, self.a, self.g)

    def alpha(self, gamma):
        return np.interp(gamma, self.g, self.a)
