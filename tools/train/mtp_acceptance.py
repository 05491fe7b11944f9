#!/usr/bin/python3
"""How often the MTP draft head agrees with the model's own greedy decoding: the acceptance per
draft position that greedy speculative decoding with K = 1..3 MTP drafts would see (vLLM's
spec_decode_num_accepted_tokens_per_pos / num_drafts), measured in PyTorch on an exported folder.

  mtp_acceptance.py --model DIR --tokens RUN/tokens.npz [--prompts 16] [--prompt-tokens 32]
                    [--new-tokens 128] [--k 3]

Prompts: the first --prompt-tokens ids of held-out documents (train.py's validation split,
documents separated by <|endoftext|>). The model continues each greedily for --new-tokens ids
(the target sequence x). At every generated position t (x_{t+1} just sampled by the target from
hidden h_t), the draft chain is vLLM's (docs/spec/model.md §3.h):
  d_1 = argmax lm_head(MTP(h_t, x_{t+1}))         at position t, MTP attention over 0..t
  d_k = argmax lm_head(MTP(m_{k-1}, d_{k-1}))     at position t + k - 1, m = the MTP's own output
Greedy verification accepts d_1..d_j while d_i == x_{t+1+i}. Printed per draft position k: the
fraction of steps whose first k drafts were all accepted, and the mean accepted length of K = 1..3
(1 + the sum of those rates up to K: tokens per target forward pass). Every generated position
counts as a step; a real run verifies only at the positions its accepted lengths lead to, which
is the same estimate when acceptance does not depend on the position.
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export import load_exported  # noqa: E402


def held_out_prompts(tokens_npz, separator, count, length):
    """The first `length` ids of the first `count` held-out documents at least that long."""
    val = np.load(tokens_npz)["val"]
    docs = np.split(val, np.flatnonzero(val == separator) + 1)
    docs = [d[d != separator] for d in docs]
    return [d[:length].tolist() for d in docs if len(d) >= length][:count]


def greedy(model, ids, new_tokens, stop_ids):
    x = list(ids)
    for _ in range(new_tokens):
        nxt = int(model(torch.tensor([x]))[0, -1].argmax())
        x.append(nxt)
        if nxt in stop_ids:
            break
    return x


def mtp_layer_pass(model, inputs, positions):
    """The MTP decoder layer and norm over [1, T, H] fc outputs (causal attention over them)."""
    u = inputs
    for layer in model.mtp.layers:
        u = layer(u, positions)
    return model.mtp.norm(u)


def mtp_fc(model, h, ids):
    """fc(concat(norm(embedding of ids), norm(h))): h [1, T, H], ids [1, T] -> [1, T, H]."""
    e = model.mtp.pre_fc_norm_embedding(model.model.embed_tokens(ids))
    return model.mtp.fc(torch.cat([e, model.mtp.pre_fc_norm_hidden(h)], -1))


def accepted_per_position(model, x, first, k):
    """Per generated position t in [first - 1, len(x) - 2): how many of the k chained drafts
    greedy verification accepts against x."""
    T = len(x)
    h = model.hidden(torch.tensor([x]))                      # [1, T, H], post-norm
    # First pass: pairs (h_j, x_{j+1}) at positions j = 0..T-2, as vLLM's shifted ids.
    u = mtp_fc(model, h[:, :T - 1], torch.tensor([x[1:]]))  # [1, T-1, H]
    m = mtp_layer_pass(model, u, torch.arange(T - 1))        # m_j for every j at once (causal)
    d1 = model.lm_head(m)[0].argmax(-1)                      # d1[j] drafts x_{j+2}
    accepted = []
    for t in range(first - 1, T - 2):
        n, draft, prev_m, chain = 0, int(d1[t]), m[:, t:t + 1], u[:, :t + 1]
        for step in range(1, k + 1):
            if t + 1 + step >= T or draft != x[t + 1 + step]:
                break
            n += 1
            if step == k:
                break
            # Next draft: (m, draft) at position t + step, attending to the first pass's 0..t and
            # the chain so far.
            chain = torch.cat([chain, mtp_fc(model, prev_m, torch.tensor([[draft]]))], 1)
            out = mtp_layer_pass(model, chain, torch.arange(chain.shape[1]))
            prev_m = out[:, -1:]
            draft = int(model.lm_head(prev_m)[0, -1].argmax())
        if t + 1 + k < T:  # only steps with k target tokens to check against
            accepted.append(n)
    return accepted


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True, help="train.py's RUN/tokens.npz")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = load_exported(a.model)
    if model.mtp is None:
        sys.exit(f"mtp_acceptance: {a.model} has no MTP layer")
    c = model.config
    stop_ids = {c["eos_token_id"], c["bos_token_id"]}
    prompts = held_out_prompts(a.tokens, c["bos_token_id"], a.prompts, a.prompt_tokens)
    if not prompts:
        sys.exit(f"mtp_acceptance: no held-out document of {a.prompt_tokens} tokens")
    counts = []
    with torch.no_grad():
        for ids in prompts:
            x = greedy(model, ids, a.new_tokens, stop_ids)
            counts += accepted_per_position(model, x, len(ids), a.k)
    counts = np.array(counts)
    print(f"mtp_acceptance: {len(prompts)} held-out prompts of {a.prompt_tokens} tokens, greedy "
          f"continuations of up to {a.new_tokens}, {len(counts)} draft steps")
    rates = [float((counts >= j).mean()) for j in range(1, a.k + 1)]
    for j, r in enumerate(rates, 1):
        cond = r / rates[j - 2] if j > 1 and rates[j - 2] > 0 else r
        print(f"  draft position {j}: accepted {r:.3f} of steps ({cond:.3f} given position "
              f"{j - 1} accepted)" if j > 1 else f"  draft position 1: accepted {r:.3f} of steps")
    for K in range(1, a.k + 1):
        print(f"  K = {K}: mean accepted length {1 + sum(rates[:K]):.2f} tokens per target pass")


if __name__ == "__main__":
    main()
