#!/usr/bin/python3
"""Writes a trained checkpoint as a Hugging Face model folder that moeserve loads unchanged.

  export.py --checkpoint RUN/checkpoint.pt --tokenizer TOK --out DIR

DIR gets config.json (architecture qwen3_next), generation_config.json, model.safetensors (every
tensor bf16, names as model.py's state_dict = the checkpoint names moeserve reads) and the
tokenizer files (tokenizer.json, tokenizer_config.json) copied from TOK. The safetensors file is
written here (no safetensors package): 8-byte little-endian header length, JSON header, data.
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as qn  # noqa: E402

_DTYPES = {"BF16": 2, "F32": 4}


def write_safetensors(path, tensors):
    """tensors: {name: torch tensor}; every tensor is stored as bf16 (round to nearest even)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        data = t.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)


def read_safetensors(path):
    """{name: f32 torch tensor} of a BF16 / F32 safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = np.frombuffer(data[b:e], dtype=np.uint16 if info["dtype"] == "BF16" else np.float32)
        if info["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] != "F32":
            raise ValueError(f"{path}: {name}: dtype {info['dtype']} not supported")
        out[name] = torch.from_numpy(raw.copy()).reshape(info["shape"])
    return out


def load_exported(model_dir):
    """The PyTorch model with an exported folder's (bf16-rounded) weights, in f32."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    m = qn.Qwen3Next(config)
    m.load_state_dict(read_safetensors(os.path.join(model_dir, "model.safetensors")))
    return m.float().eval()


def export(checkpoint, tokenizer_dir, out):
    state = torch.load(checkpoint, map_location="cpu")
    config = dict(state["config"])
    config["torch_dtype"] = "bfloat16"
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    # Generation ends at <|im_end|> (a chat answer) or <|endoftext|> (bos: the document
    # separator), as Qwen's generation_config lists both. The sampling defaults (what `serve`
    # and `chat` use for keys a request leaves out) were picked by reading samples of the
    # trained model: a small model loops under greedy decoding, and a repetition penalty of 1.1
    # breaks most loops without garbling the text.
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": config["bos_token_id"],
                   "eos_token_id": [config["eos_token_id"], config["bos_token_id"]],
                   "do_sample": True, "temperature": 0.7, "top_p": 0.9,
                   "repetition_penalty": 1.1}, f, indent=2)
        f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(out, name))
    # The state dict of a fresh model fixes the names and shapes: nothing missing or extra.
    expected = qn.Qwen3Next(config).state_dict()
    weights = state["model"]
    missing = set(expected) - set(weights)
    extra = set(weights) - set(expected)
    if missing or extra:
        raise SystemExit(f"export: checkpoint does not match its config: missing {sorted(missing)}"
                         f", unexpected {sorted(extra)}")
    write_safetensors(os.path.join(out, "model.safetensors"), {k: weights[k] for k in expected})
    size = os.path.getsize(os.path.join(out, "model.safetensors"))
    print(f"export: {len(expected)} tensors, {size / 1e6:.1f} MB -> {out}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    export(a.checkpoint, a.tokenizer, a.out)


if __name__ == "__main__":
    main()
