"""Qwen3-Next in plain PyTorch, written from docs/spec/model.md (section numbers below).

Module and parameter names are the checkpoint's (docs/spec/model.md §2.1, §2.2), so state_dict() keys are the
safetensors tensor names moeserve loads for architecture qwen3_next; the config is the HF
config.json dict. Activations run in the input dtype (f32 for training and checks); the bf16
roundings of HF's bf16 runs are not modelled: moeserve computes in f32 too.

Shapes in comments: B batch, T tokens, H hidden, E experts.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

GDN_CHUNK = 64
L2_EPS = 1e-6  # FLA / HF l2norm: x * rsqrt(sum(x^2) + 1e-6), eps on the sum (§4.2)


# ---- norms (§3.a, §3.b) --------------------------------------------------------------------------

class RMSNorm1p(nn.Module):
    """Zero-centred RMSNorm: y = x * rsqrt(mean(x^2) + eps) * (1 + w); w stored around 0."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class GatedRMSNorm(nn.Module):
    """GDN output norm: plain weight (init 1, no +1), normalise first, then * silu(z)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, z):
        x32 = x.float()
        n = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (n * self.weight.float() * F.silu(z.float())).type_as(x)


def l2norm(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


# ---- gated delta rule (§3.c.5, §3.c.6) -----------------------------------------------------------

def recurrent_gated_delta_rule(q, k, v, g, beta, state=None):
    """The token-by-token definition. q, k: [B, h, T, dk] (l2-normed), v: [B, h, T, dv],
    g, beta: [B, h, T]. Returns (o [B, h, T, dv], final state [B, h, dk, dv])."""
    B, nh, T, dk = q.shape
    dv = v.shape[-1]
    q = q * dk ** -0.5
    S = q.new_zeros(B, nh, dk, dv) if state is None else state
    out = []
    for t in range(T):
        S = S * g[:, :, t].exp()[..., None, None]
        kv_mem = (S * k[:, :, t, :, None]).sum(-2)                  # S^T k   [B, h, dv]
        delta = (v[:, :, t] - kv_mem) * beta[:, :, t, None]
        S = S + k[:, :, t, :, None] * delta[:, :, None, :]          # S += k (x) delta
        out.append((S * q[:, :, t, :, None]).sum(-2))               # S^T q (updated S)
    return torch.stack(out, dim=2), S


def chunk_gated_delta_rule(q, k, v, g, beta, chunk=GDN_CHUNK):
    """The chunked form (HF torch_chunk_gated_delta_rule), same arguments, zero initial state.
    The within-chunk triangular recursion is solved with a triangular solve: the HF loop computes
    (I + M)^-1 for the strictly lower M = (k_beta k^T) * decay."""
    B, nh, T, dk = q.shape
    dv = v.shape[-1]
    q = q * dk ** -0.5
    pad = (chunk - T % chunk) % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    N = (T + pad) // chunk
    k_beta = k * beta[..., None]
    v_beta = v * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(B, nh, N, chunk, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    g = g.reshape(B, nh, N, chunk).cumsum(-1)                       # gamma, within each chunk
    diff = g[..., :, None] - g[..., None, :]                        # gamma_i - gamma_j
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = torch.where(lower, diff, torch.zeros_like(diff)).exp() * lower   # L
    strict = lower & ~torch.eye(chunk, dtype=torch.bool, device=q.device)
    M = (k_beta @ k.transpose(-1, -2)) * decay * strict
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    Tm = torch.linalg.solve_triangular(eye + M, eye.expand_as(M), upper=False, unitriangular=True)
    U = Tm @ v_beta                                                 # [B, h, N, C, dv]
    W = Tm @ (k_beta * g.exp()[..., None])                          # [B, h, N, C, dk]
    Aqk_all = (q @ k.transpose(-1, -2)) * decay                     # lower incl. diagonal
    S = q.new_zeros(B, nh, dk, dv)
    outs = []
    for n in range(N):
        v_new = U[:, :, n] - W[:, :, n] @ S
        outs.append((q[:, :, n] * g[:, :, n, :, None].exp()) @ S + Aqk_all[:, :, n] @ v_new)
        g_last = g[:, :, n, -1]
        S = S * g_last.exp()[..., None, None] + (
            k[:, :, n] * (g_last[..., None] - g[:, :, n]).exp()[..., None]).transpose(-1, -2) @ v_new
    o = torch.stack(outs, dim=2).reshape(B, nh, N * chunk, dv)[:, :, :T]
    return o, S


# ---- Gated DeltaNet layer (§3.c) -----------------------------------------------------------------

class GatedDeltaNet(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c["hidden_size"]
        self.nk, self.nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        self.dk, self.dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        self.r = self.nv // self.nk
        self.key_dim, self.value_dim = self.nk * self.dk, self.nv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.kc = c["linear_conv_kernel_dim"]
        # Rows interleaved per key-head group g: [q_g | k_g | v_g (r heads) | z_g (r heads)] and
        # [b_g (r) | a_g (r)] (§3.c.1).
        self.in_proj_qkvz = nn.Linear(H, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(H, 2 * self.nv, bias=False)
        # Depthwise causal conv over the de-interleaved [q | k | v] channels.
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kc, groups=self.conv_dim,
                                padding=self.kc - 1, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.nv).uniform_(1, 16)))
        self.norm = GatedRMSNorm(self.dv, c["rms_norm_eps"])
        self.out_proj = nn.Linear(self.value_dim, H, bias=False)

    def forward(self, x, recurrent=False):
        B, T, _ = x.shape
        nk, nv, dk, dv, r = self.nk, self.nv, self.dk, self.dv, self.r
        P = self.in_proj_qkvz(x).view(B, T, nk, 2 * dk + 2 * r * dv)
        q, k, v, z = torch.split(P, [dk, dk, r * dv, r * dv], dim=-1)
        ba = self.in_proj_ba(x).view(B, T, nk, 2 * r)
        b, a = torch.split(ba, [r, r], dim=-1)
        v = v.reshape(B, T, nv, dv)
        z = z.reshape(B, T, nv, dv)
        b = b.reshape(B, T, nv)
        a = a.reshape(B, T, nv)
        mixed = torch.cat([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], -1)
        mixed = F.silu(self.conv1d(mixed.transpose(1, 2))[..., :T]).transpose(1, 2)  # [B, T, conv]
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = l2norm(q.reshape(B, T, nk, dk).float())
        k = l2norm(k.reshape(B, T, nk, dk).float())
        v = v.reshape(B, T, nv, dv).float()
        beta = b.float().sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        if r > 1:  # value head h reads key head h // r (repeat_interleave, §3.c.4)
            q = q.repeat_interleave(r, dim=2)
            k = k.repeat_interleave(r, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))            # [B, nv, T, d]
        beta, g = beta.transpose(1, 2), g.transpose(1, 2)          # [B, nv, T]
        rule = recurrent_gated_delta_rule if recurrent else chunk_gated_delta_rule
        with torch.autocast("cpu", enabled=False):  # the delta rule stays f32 under bf16 autocast
            o, _ = rule(q, k, v, g, beta)
        o = o.transpose(1, 2).to(x.dtype)                          # [B, T, nv, dv]
        o = self.norm(o, z).reshape(B, T, self.value_dim)
        return self.out_proj(o)


# ---- gated full attention (§3.d) -----------------------------------------------------------------

def rope_cos_sin(positions, rot, theta, dtype):
    inv_freq = 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    freqs = positions.double()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], -1)                             # [T, rot]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_partial_rope(x, cos, sin, rot):
    """x: [B, heads, T, hd]; NeoX rotate_half on the first rot dims only."""
    xr, xp = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = torch.cat([-xr[..., half:], xr[..., :half]], -1)
    return torch.cat([xr * cos + rotated * sin, xp], -1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c["hidden_size"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.rot = int(self.hd * c["partial_rotary_factor"])
        self.theta = c["rope_theta"]
        # q_proj rows per head h: [query_h (hd) ; gate_h (hd)] (§3.d, §4.11).
        self.q_proj = nn.Linear(H, self.nh * self.hd * 2, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm = RMSNorm1p(self.hd, c["rms_norm_eps"])
        self.k_norm = RMSNorm1p(self.hd, c["rms_norm_eps"])

    def forward(self, x, positions):
        B, T, _ = x.shape
        nh, nkv, hd = self.nh, self.nkv, self.hd
        q, gate = torch.chunk(self.q_proj(x).view(B, T, nh, 2 * hd), 2, dim=-1)
        gate = gate.reshape(B, T, nh * hd)
        q = self.q_norm(q).transpose(1, 2)                          # [B, nh, T, hd]
        k = self.k_norm(self.k_proj(x).view(B, T, nkv, hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, nkv, hd).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, self.rot, self.theta, x.dtype)
        q = apply_partial_rope(q, cos, sin, self.rot)
        k = apply_partial_rope(k, cos, sin, self.rot)
        if nh != nkv:  # query head h uses KV head h // (nh / nkv)
            k = k.repeat_interleave(nh // nkv, dim=1)
            v = v.repeat_interleave(nh // nkv, dim=1)
        s = (q @ k.transpose(-1, -2)) * hd ** -0.5
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        p = s.float().masked_fill(causal, float("-inf")).softmax(-1).to(v.dtype)
        o = (p @ v).transpose(1, 2).reshape(B, T, nh * hd)
        return self.o_proj(o * torch.sigmoid(gate))


# ---- sparse MoE with gated shared expert (§3.e) --------------------------------------------------

class SwiGlu(nn.Module):
    def __init__(self, H, width):
        super().__init__()
        self.gate_proj = nn.Linear(H, width, bias=False)
        self.up_proj = nn.Linear(H, width, bias=False)
        self.down_proj = nn.Linear(width, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoe(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c["hidden_size"]
        self.E, self.k = c["num_experts"], c["num_experts_per_tok"]
        self.norm_topk = c.get("norm_topk_prob", True)
        self.gate = nn.Linear(H, self.E, bias=False)
        self.experts = nn.ModuleList(SwiGlu(H, c["moe_intermediate_size"]) for _ in range(self.E))
        self.shared_expert = SwiGlu(H, c["shared_expert_intermediate_size"])
        self.shared_expert_gate = nn.Linear(H, 1, bias=False)
        self.aux_loss = None  # set by forward: the Switch-style load-balancing loss

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])                                # [N, H]
        probs = F.softmax(self.gate(x).float(), dim=-1)             # [N, E], f32
        w, ids = torch.topk(probs, self.k, dim=-1)                  # sorted descending
        if self.norm_topk:
            w = w / w.sum(-1, keepdim=True)
        w = w.to(x.dtype)
        # Load balance (Switch / HF load_balancing_loss_func): E * sum_e fraction_e * mean_prob_e.
        frac = F.one_hot(ids, self.E).float().sum(1).mean(0) / self.k
        self.aux_loss = self.E * (frac * probs.mean(0)).sum()
        out = torch.zeros_like(x)
        flat_ids = ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)                # (token, choice) by expert
        counts = torch.bincount(flat_ids, minlength=self.E).tolist()
        tokens = order // self.k
        weights = w.reshape(-1)[order]
        start = 0
        for e, n in enumerate(counts):                              # ascending expert id
            if n:
                idx = tokens[start:start + n]
                y = self.experts[e](x[idx]) * weights[start:start + n, None]
                out = out.index_add(0, idx, y)
            start += n
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return (out + shared).reshape(shape)


# ---- decoder layer, model, MTP (§3.f - §3.h) -----------------------------------------------------

class DecoderLayer(nn.Module):
    def __init__(self, c, layer_type):
        super().__init__()
        H, eps = c["hidden_size"], c["rms_norm_eps"]
        self.layer_type = layer_type
        self.input_layernorm = RMSNorm1p(H, eps)
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(c)
        else:
            self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm1p(H, eps)
        self.mlp = SparseMoe(c)

    def forward(self, x, positions, recurrent=False):
        h = self.input_layernorm(x)
        if self.layer_type == "linear_attention":
            h = self.linear_attn(h, recurrent=recurrent)
        else:
            h = self.self_attn(h, positions)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):  # the "model." prefix
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(c, t) for t in c["layer_types"])
        self.norm = RMSNorm1p(c["hidden_size"], c["rms_norm_eps"])


class Mtp(nn.Module):  # the "mtp." prefix (§2.2)
    def __init__(self, c):
        super().__init__()
        H, eps = c["hidden_size"], c["rms_norm_eps"]
        self.pre_fc_norm_embedding = RMSNorm1p(H, eps)
        self.pre_fc_norm_hidden = RMSNorm1p(H, eps)
        self.fc = nn.Linear(2 * H, H, bias=False)                   # input: [embedding | hidden]
        self.layers = nn.ModuleList([DecoderLayer(c, "full_attention")])
        self.norm = RMSNorm1p(H, eps)


class Qwen3Next(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.model = Backbone(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.mtp = Mtp(c) if c.get("num_nextn_predict_layers", 0) > 0 else None
        self.apply(self._init)
        # Residual-branch outputs start smaller (GPT-2): 0.02 / sqrt(2 * layers).
        scale = 0.02 / math.sqrt(2 * (len(c["layer_types"]) + 1))
        for name, p in self.named_parameters():
            if name.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=scale)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        elif isinstance(m, nn.Conv1d):
            nn.init.normal_(m.weight, std=1.0 / math.sqrt(m.kernel_size[0]))

    def hidden(self, ids, recurrent=False):
        """ids [B, T] -> post-final-norm hidden [B, T, H] (the lm_head and MTP input)."""
        T = ids.shape[1]
        positions = torch.arange(T, device=ids.device)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, positions, recurrent=recurrent)
        return self.model.norm(x)

    def mtp_hidden(self, h, next_ids):
        """h [B, T, H] main hidden at t, next_ids [B, T] the token at t + 1 -> MTP hidden whose
        logits predict the token at t + 2 (§3.h; RoPE at position t)."""
        T = h.shape[1]
        positions = torch.arange(T, device=h.device)
        e = self.mtp.pre_fc_norm_embedding(self.model.embed_tokens(next_ids))
        u = self.mtp.fc(torch.cat([e, self.mtp.pre_fc_norm_hidden(h)], -1))
        for layer in self.mtp.layers:
            u = layer(u, positions)
        return self.mtp.norm(u)

    def aux_loss(self):
        losses = [m.aux_loss for m in self.modules() if isinstance(m, SparseMoe) and
                  m.aux_loss is not None]
        return torch.stack(losses).mean() if losses else torch.zeros(())

    def forward(self, ids, recurrent=False):
        """Logits [B, T, V] of the main head."""
        return self.lm_head(self.hidden(ids, recurrent=recurrent))

    def loss(self, seq, mtp_weight=0.3, aux_weight=0.01, mtp_detach=False):
        """seq [B, T + 2]: main CE predicts seq[t+1] from seq[:t+1] for t < T; MTP CE predicts
        seq[t+2] from (hidden at t, embedding of seq[t+1]). Returns (total, main, mtp, aux)."""
        T = seq.shape[1] - 2
        inp = seq[:, :T]
        h = self.hidden(inp)
        logits = self.lm_head(h)
        V = logits.shape[-1]
        main = F.cross_entropy(logits.float().reshape(-1, V), seq[:, 1:T + 1].reshape(-1))
        total = main
        mtp = torch.zeros(())
        if self.mtp is not None and mtp_weight > 0:
            m = self.mtp_hidden(h.detach() if mtp_detach else h, seq[:, 1:T + 1])
            mtp = F.cross_entropy(self.lm_head(m).float().reshape(-1, V),
                                  seq[:, 2:T + 2].reshape(-1))
            total = total + mtp_weight * mtp
        aux = self.aux_loss()
        total = total + aux_weight * aux
        return total, main, mtp, aux


def count_params(model):
    """(total, active per token) parameters, embeddings included, MTP excluded."""
    c = model.config
    total = active = 0
    for name, p in model.named_parameters():
        if name.startswith("mtp."):
            continue
        total += p.numel()
        if ".experts." in name:
            active += p.numel() * c["num_experts_per_tok"] / c["num_experts"]
        else:
            active += p.numel()
    return total, int(active)
