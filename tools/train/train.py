#!/usr/bin/python3
"""Trains the small Qwen3-Next model (model.py) on a tokenized corpus, on CPU.

  train.py --corpus-dir C --tokenizer TOK --moeserve BIN --out RUN [--preset P]
           [--time-budget-minutes 120] [--tiny] [--resume]
  train.py --bench [--presets a,b,c]   tokens/s of each preset (no data needed: random tokens)

--corpus-dir holds corpus.jsonl (prepare_corpus.py); --tokenizer the folder `moeserve
train-tokenizer` wrote. The corpus is tokenized once with `moeserve tokenize --texts-file` into
RUN/tokens.npy (documents joined by <|endoftext|>; every 50th document held out for validation).
RUN gets: checkpoint.pt (model, optimizer, step, config), log.csv, loss.png, samples.txt.

The learning rate warms up linearly, then follows a cosine to 10 % over the run, where the run's
progress is max(step / --max-steps, elapsed / budget): a time budget ends the run on schedule.
Loss = main next-token CE + --mtp-weight * MTP CE (token t+2 from hidden t and embedding t+1)
+ --aux-weight * MoE load-balancing loss.
"""
import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as qn  # noqa: E402

# ---- configs -------------------------------------------------------------------------------------


def make_config(preset, vocab_size, bos_token_id, eos_token_id):
    """The HF config.json dict (architecture qwen3_next) of a preset."""
    p = dict(PRESETS[preset])
    layers = p.pop("num_hidden_layers")
    interval = 4
    c = {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "vocab_size": vocab_size,
        "hidden_size": p["hidden_size"],
        "intermediate_size": p.get("intermediate_size", 4 * p["hidden_size"]),
        "num_hidden_layers": layers,
        "num_attention_heads": p["num_attention_heads"],
        "num_key_value_heads": p["num_key_value_heads"],
        "head_dim": p["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "rope_scaling": None,
        "linear_num_key_heads": p["linear_num_key_heads"],
        "linear_num_value_heads": p["linear_num_value_heads"],
        "linear_key_head_dim": p["linear_head_dim"],
        "linear_value_head_dim": p["linear_head_dim"],
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": interval,
        "layer_types": ["linear_attention" if (i + 1) % interval else "full_attention"
                        for i in range(layers)],
        "num_experts": p["num_experts"],
        "num_experts_per_tok": p["num_experts_per_tok"],
        "moe_intermediate_size": p["moe_intermediate_size"],
        "shared_expert_intermediate_size": p["shared_expert_intermediate_size"],
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_nextn_predict_layers": 1,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": "bfloat16",
    }
    return c


def _preset(H, L, heads, kv, hd, nk, nv, dkv, E, k, I, Is):
    return dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=heads,
                num_key_value_heads=kv, head_dim=hd, linear_num_key_heads=nk,
                linear_num_value_heads=nv, linear_head_dim=dkv, num_experts=E,
                num_experts_per_tok=k, moe_intermediate_size=I, shared_expert_intermediate_size=Is)


PRESETS = {
    # smoke test: a few hundred thousand parameters
    "tiny": _preset(64, 4, 2, 1, 32, 1, 2, 32, 4, 2, 32, 64),
    # candidates for the default model (vocab 8k); README.md has their measured throughput
    "h256-e16": _preset(256, 8, 4, 2, 64, 2, 4, 64, 16, 2, 128, 256),
    "h256-e32": _preset(256, 8, 4, 2, 64, 2, 4, 64, 32, 4, 64, 256),
    "h320-e16": _preset(320, 8, 4, 2, 80, 2, 4, 80, 16, 2, 96, 320),
}


# ---- data ----------------------------------------------------------------------------------------

def special_ids(tokenizer_dir):
    with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    vocab_size = max(max(tok["model"]["vocab"].values()), max(ids.values())) + 1
    return vocab_size, ids["<|endoftext|>"], ids["<|im_end|>"]


def tokenize_corpus(moeserve, tokenizer_dir, corpus_dir, out_dir, eot):
    """Returns (train ids, val ids) as int32 arrays, cached in out_dir/tokens.npz."""
    cache = os.path.join(out_dir, "tokens.npz")
    if os.path.exists(cache):
        d = np.load(cache)
        return d["train"], d["val"]
    t0 = time.time()
    proc = subprocess.run([moeserve, "tokenize", "--model", tokenizer_dir, "--texts-file",
                           os.path.join(corpus_dir, "corpus.jsonl")],
                          check=True, capture_output=True, text=True)
    train, val = [], []
    for i, line in enumerate(proc.stdout.splitlines()):
        ids = json.loads(line)["ids"] + [eot]
        (val if i % 50 == 49 else train).extend(ids)
    train, val = np.array(train, dtype=np.int32), np.array(val, dtype=np.int32)
    np.savez(cache, train=train, val=val)
    print(f"tokenized: {len(train)} train + {len(val)} val tokens in {time.time() - t0:.1f} s",
          flush=True)
    return train, val


def batch(ids, batch_size, length, rng):
    """[batch_size, length] random windows."""
    starts = rng.integers(0, len(ids) - length, size=batch_size)
    return torch.from_numpy(np.stack([ids[s:s + length] for s in starts]).astype(np.int64))


# ---- training ------------------------------------------------------------------------------------

def lr_at(step, progress, a):
    if step < a.warmup_steps:
        return a.lr * (step + 1) / a.warmup_steps
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def make_optimizer(model, a):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed_tokens" not in name else no_decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=a.lr, betas=(0.9, 0.95), eps=1e-8)


@torch.no_grad()
def evaluate(model, val, a):
    model.eval()
    rng = np.random.default_rng(1234)  # the same windows every time
    main = mtp = 0.0
    for _ in range(a.eval_batches):
        _, m, t, _ = model.loss(batch(val, a.batch_size, a.seq_len + 2, rng), a.mtp_weight)
        main += m.item()
        mtp += t.item()
    model.train()
    return main / a.eval_batches, mtp / a.eval_batches


@torch.no_grad()
def greedy(model, ids, n):
    model.eval()
    ids = list(ids)
    for _ in range(n):
        logits = model(torch.tensor([ids]))[0, -1]
        ids.append(int(logits.argmax()))
    model.train()
    return ids


def plot(log_path, png_path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    all_rows = list(csv.DictReader(open(log_path)))
    rows = [r for r in all_rows if r["train_main"]]
    if not rows:
        return
    tokens = np.array([float(r["tokens"]) for r in rows]) / 1e6
    main = np.array([float(r["train_main"]) for r in rows])
    mtp = np.array([float(r["train_mtp"]) for r in rows])
    k = max(1, len(main) // 50)
    smooth = lambda x: np.convolve(x, np.ones(k) / k, mode="valid")  # noqa: E731
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot(tokens[k - 1:], smooth(main), label="train next-token CE", lw=1)
    ax.plot(tokens[k - 1:], smooth(mtp), label="train MTP CE (token t+2)", lw=1)
    ev = [r for r in all_rows if r["val_main"]]
    if ev:
        ax.plot([float(r["tokens"]) / 1e6 for r in ev], [float(r["val_main"]) for r in ev], "o-",
                label="val next-token CE", ms=3)
        ax.plot([float(r["tokens"]) / 1e6 for r in ev], [float(r["val_mtp"]) for r in ev], "s-",
                label="val MTP CE", ms=3)
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def save_checkpoint(path, model, opt, step, tokens, elapsed, a):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                "tokens": tokens, "elapsed": elapsed, "config": model.config, "args": vars(a)}, tmp)
    os.replace(tmp, path)


def train(a):
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    os.makedirs(a.out, exist_ok=True)
    vocab_size, eot, eos = special_ids(a.tokenizer)
    train_ids, val_ids = tokenize_corpus(a.moeserve, a.tokenizer, a.corpus_dir, a.out, eot)
    if len(val_ids) < a.seq_len + 3:  # tiny corpora: validate on the training tokens
        val_ids = train_ids
    ckpt_path = os.path.join(a.out, "checkpoint.pt")
    state = torch.load(ckpt_path) if a.resume and os.path.exists(ckpt_path) else None
    config = state["config"] if state else make_config(a.preset, vocab_size, eot, eos)
    model = qn.Qwen3Next(config)
    opt = make_optimizer(model, a)
    step, tokens, elapsed0 = 0, 0, 0.0
    if state:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, tokens, elapsed0 = state["step"], state["tokens"], state["elapsed"]
        rng = np.random.default_rng(a.seed + step)  # new windows after a resume
        print(f"resumed at step {step}", flush=True)
    total, active = qn.count_params(model)
    mtp_params = sum(p.numel() for n, p in model.named_parameters() if n.startswith("mtp."))
    print(f"preset {a.preset}: {total / 1e6:.2f} M parameters ({active / 1e6:.2f} M active per "
          f"token) + {mtp_params / 1e6:.2f} M MTP; {len(train_ids)} train tokens", flush=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    log_path = os.path.join(a.out, "log.csv")
    fields = ["step", "tokens", "elapsed_s", "lr", "train_main", "train_mtp", "train_aux",
              "val_main", "val_mtp"]
    if not state or not os.path.exists(log_path):
        with open(log_path, "w", newline="") as f:
            csv.writer(f).writerow(fields)
    budget = a.time_budget_minutes * 60
    start = time.time() - elapsed0
    last_ckpt = time.time()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16)
    row = None
    while True:
        elapsed = time.time() - start
        progress = max(step / a.max_steps if a.max_steps else 0.0,
                       elapsed / budget if budget else 0.0)
        if progress >= 1.0:
            break
        lr = lr_at(step, progress, a)
        for group in opt.param_groups:
            group["lr"] = lr
        seq = batch(train_ids, a.batch_size, a.seq_len + 2, rng)
        with autocast:
            loss, main, mtp, aux = model.loss(seq, a.mtp_weight, a.aux_weight, a.mtp_detach)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        step += 1
        tokens += a.batch_size * a.seq_len
        row = {"step": step, "tokens": tokens, "elapsed_s": f"{time.time() - start:.1f}",
               "lr": f"{lr:.3e}", "train_main": f"{main.item():.4f}",
               "train_mtp": f"{mtp.item():.4f}", "train_aux": f"{aux.item():.4f}",
               "val_main": "", "val_mtp": ""}
        if step % a.eval_every == 0:
            vm, vt = evaluate(model, val_ids, a)
            row["val_main"], row["val_mtp"] = f"{vm:.4f}", f"{vt:.4f}"
        with open(log_path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=fields).writerow(row)
        if step % a.print_every == 0 or row["val_main"]:
            rate = tokens / max(time.time() - start, 1e-9)
            print(f"step {step} tokens {tokens} lr {lr:.2e} main {main.item():.3f} mtp "
                  f"{mtp.item():.3f} aux {aux.item():.3f}"
                  + (f" | val {row['val_main']} mtp {row['val_mtp']}" if row["val_main"] else "")
                  + f" | {rate:.0f} tok/s, {(time.time() - start) / 60:.1f} min", flush=True)
        if time.time() - last_ckpt > a.checkpoint_minutes * 60:
            save_checkpoint(ckpt_path, model, opt, step, tokens, time.time() - start, a)
            last_ckpt = time.time()

    vm, vt = evaluate(model, val_ids, a)
    if row is not None and not row["val_main"]:  # the final validation: a row of its own
        with open(log_path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=fields).writerow(
                {"step": step, "tokens": tokens, "elapsed_s": f"{time.time() - start:.1f}",
                 "lr": "", "train_main": "", "train_mtp": "", "train_aux": "",
                 "val_main": f"{vm:.4f}", "val_mtp": f"{vt:.4f}"})
    print(f"done: {step} steps, {tokens} tokens, {(time.time() - start) / 60:.1f} min; "
          f"val main CE {vm:.4f} MTP CE {vt:.4f}", flush=True)
    save_checkpoint(ckpt_path, model, opt, step, tokens, time.time() - start, a)
    plot(log_path, os.path.join(a.out, "loss.png"),
         f"Qwen3-Next {a.preset}: {total / 1e6:.1f} M params ({active / 1e6:.1f} M active)")
    if a.samples:
        write_samples(model, a, os.path.join(a.out, "samples.txt"))


def write_samples(model, a, path):
    prompts = ["In the beginning", "And Jesus said unto them,", "It is a truth universally",
               "Elizabeth was", "The LORD is my shepherd;",
               "<|im_start|>user\nEmma, Chapter 1\nEmma Woodhouse, handsome, clever, and rich, "
               "with a comfortable home and happy disposition.<|im_end|>\n<|im_start|>assistant\n"]
    payload = "\n".join(json.dumps({"text": p}) for p in prompts) + "\n"
    enc = subprocess.run([a.moeserve, "tokenize", "--model", a.tokenizer, "--texts-file",
                          "/dev/stdin"], input=payload, check=True, capture_output=True, text=True)
    lines = []
    for p, line in zip(prompts, enc.stdout.splitlines()):
        ids = greedy(model, json.loads(line)["ids"], 48)
        dec = subprocess.run([a.moeserve, "detokenize", "--model", a.tokenizer, "--ids",
                              ",".join(map(str, ids))], capture_output=True, text=True)
        lines.append(f"## {p}\n{dec.stdout.strip() if dec.returncode == 0 else ids}\n")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    print("".join(lines), flush=True)


def bench(a):
    """Tokens/s of a few training steps per preset, on random tokens."""
    for preset in a.presets.split(","):
        torch.manual_seed(0)
        config = make_config(preset, 8192, 8189, 8191)
        model = qn.Qwen3Next(config)
        opt = make_optimizer(model, a)
        total, active = qn.count_params(model)
        seqs = [torch.randint(0, 8192, (a.batch_size, a.seq_len + 2)) for _ in range(2)]
        for bf16 in ([False, True] if a.bench_f32 else [a.bf16]):
            times = []
            for i in range(a.bench_steps + 1):
                t0 = time.time()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = model.loss(seqs[i % 2], a.mtp_weight, a.aux_weight)[0]
                opt.zero_grad()
                loss.backward()
                opt.step()
                if i:  # the first step warms up
                    times.append(time.time() - t0)
            rate = a.batch_size * a.seq_len / np.median(times)
            print(f"{preset}: {total / 1e6:.2f} M params, {active / 1e6:.2f} M active, "
                  f"{'bf16 autocast' if bf16 else 'f32'}: {rate:.0f} tokens/s "
                  f"(batch {a.batch_size} x {a.seq_len}) -> {rate * 7200 / 1e6:.1f} M tokens in "
                  f"2 h", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("--corpus-dir")
    ap.add_argument("--tokenizer")
    ap.add_argument("--moeserve", default="moeserve")
    ap.add_argument("--out")
    ap.add_argument("--preset", default="h256-e16", choices=sorted(PRESETS))
    ap.add_argument("--time-budget-minutes", type=float, default=120.0)
    ap.add_argument("--max-steps", type=int, default=0, help="0: no step limit")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--mtp-detach", action="store_true",
                    help="the MTP loss does not train the main model's layers")
    ap.add_argument("--aux-weight", type=float, default=0.01)
    ap.add_argument("--f32", dest="bf16", action="store_false",
                    help="f32 matmuls instead of bf16 autocast (3x slower with AVX512-BF16)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--print-every", type=int, default=20)
    ap.add_argument("--checkpoint-minutes", type=float, default=10.0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--samples", action="store_true", help="greedy samples at the end")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke test: tiny preset, 2 steps of 2 x 64 tokens")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--presets", default=",".join(p for p in PRESETS if p != "tiny"))
    ap.add_argument("--bench-steps", type=int, default=3)
    ap.add_argument("--bench-f32", action="store_true", help="--bench: f32 and bf16 autocast")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.bench:
        return bench(a)
    if a.tiny:
        a.preset, a.max_steps, a.batch_size, a.seq_len = "tiny", 2, 2, 64
        a.time_budget_minutes, a.warmup_steps, a.eval_every, a.eval_batches = 0, 1, 1, 1
    for flag in ("corpus_dir", "tokenizer", "out"):
        if not getattr(a, flag):
            ap.error(f"--{flag.replace('_', '-')} is required")
    if not a.max_steps and not a.time_budget_minutes:
        ap.error("give --time-budget-minutes or --max-steps")
    train(a)


if __name__ == "__main__":
    main()
