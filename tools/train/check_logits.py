#!/usr/bin/python3
"""Compares moeserve's logits with the PyTorch model's on an exported folder: a second,
independent implementation of the Qwen3-Next forward pass (model.py, from the spec).

  check_logits.py --moeserve BIN --model DIR [--prompt TEXT ...] [--random-lengths 5,70,150]
                  [--tolerance 1e-3]

PyTorch runs in f32 on the exported (bf16-rounded) weights; moeserve runs `moeserve logits
--all-positions --mtp` (f32 activations). Both the main logits [T, V] and the MTP draft logits
[T, V] are compared (the MTP input at t is the hidden state at t and token t + 1; the last
position takes moeserve's greedy next token, as `moeserve logits --mtp` does).

Error per position: max_v |moeserve - torch| / max_v |torch| (relative to the row's largest
logit); the check fails when any position of any prompt exceeds --tolerance. Also checks that the
chunked and the recurrent delta rule agree on the PyTorch side.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export import load_exported  # noqa: E402


def moeserve_logits(binary, model_dir, ids, work):
    out = os.path.join(work, "logits.f32")
    subprocess.run([binary, "logits", "--model", model_dir, "--token-ids", ",".join(map(str, ids)),
                    "--all-positions", "--mtp", "--out", out], check=True)
    main = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)
    mtp = np.fromfile(out + ".mtp", dtype=np.float32).reshape(len(ids), -1)
    return main, mtp


def row_error(a, b):
    """Per row: max |a - b| / max |b|."""
    return np.abs(a - b).max(-1) / np.abs(b).max(-1)


def tokenize(binary, model_dir, texts):
    payload = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    out = subprocess.run([binary, "tokenize", "--model", model_dir, "--texts-file", "/dev/stdin"],
                         input=payload, check=True, capture_output=True, text=True).stdout
    return [json.loads(line)["ids"] for line in out.splitlines()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--moeserve", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", action="append", default=[])
    ap.add_argument("--random-lengths", default="7,70,150",
                    help="also random token ids of these lengths (150 spans 3 GDN chunks)")
    ap.add_argument("--tolerance", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = load_exported(a.model)
    vocab = model.config["vocab_size"]
    prompts = a.prompt or ["In the beginning God created the heaven and the earth.",
                           "It is a truth universally acknowledged, that a single man"]
    cases = list(zip(prompts, tokenize(a.moeserve, a.model, prompts)))
    rng = np.random.default_rng(0)
    for n in (int(x) for x in a.random_lengths.split(",") if x):
        cases.append((f"random ids x{n}", rng.integers(0, vocab, n).tolist()))

    worst, failed = 0.0, False
    with tempfile.TemporaryDirectory() as work, torch.no_grad():
        for name, ids in cases:
            ref_main, ref_mtp = None, None
            x = torch.tensor([ids])
            h = model.hidden(x)
            ref_main = model.lm_head(h)[0].numpy()
            h_rec = model.hidden(x, recurrent=True)
            chunk_vs_rec = float(row_error(model.lm_head(h_rec)[0].numpy(), ref_main).max())
            got_main, got_mtp = moeserve_logits(a.moeserve, a.model, ids, work)
            nxt = ids[1:] + [int(got_main[-1].argmax())]
            ref_mtp = model.lm_head(model.mtp_hidden(h, torch.tensor([nxt])))[0].numpy()
            e_main = float(row_error(got_main, ref_main).max())
            e_mtp = float(row_error(got_mtp, ref_mtp).max())
            same_argmax = float((got_main.argmax(-1) == ref_main.argmax(-1)).mean())
            ok = max(e_main, e_mtp, chunk_vs_rec) <= a.tolerance
            failed |= not ok
            worst = max(worst, e_main, e_mtp)
            print(f"{'ok  ' if ok else 'FAIL'} {name[:40]!r:44} T={len(ids):4d}  main {e_main:.2e}  "
                  f"mtp {e_mtp:.2e}  (chunk vs recurrent {chunk_vs_rec:.2e}, argmax agree "
                  f"{same_argmax:.0%})")
    print(f"check_logits: worst relative error {worst:.2e} (tolerance {a.tolerance:g}): "
          f"{'FAILED' if failed else 'passed'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
