#!/usr/bin/env python3
"""An independent numpy definition of GGML's block formats, for kernels/ggml_blocks_test.cc.

Usage: ggml_dequant_reference.py FORMAT IN OUT [FORMAT IN OUT ...]

Reads the raw bytes of IN as consecutive blocks of FORMAT (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k,
q5_k, q6_k; or f32, f16, bf16 values) and writes their weights to OUT as little-endian f32.

Written from the formats' definitions (llama.cpp's ggml-common.h block layouts and
dequantize_row_* formulas), not from moeserve's C++: whole arrays of blocks at once, every product
and sum in float32 in ggml's order, f16 widened exactly by its bit layout:

  q8_0   d * q                        q4_0   (q - 8) * d          q5_0   (q - 16) * d
  q4_1   q * d + m                    q5_1   q * d + m
  q4_k   (d * sc) * q - (dmin * m)    q5_k   as q4_k              q6_k   (d * sc) * (q - 32)

IEEE leaves one choice open, fixed as moeserve's definition does (kernels/ref/ggml_blocks_ref.h):
where both q * d and m are NaN, q4_1 and q5_1 give q * d.
"""

import sys

import numpy as np

F32 = np.float32


def u16_le(lo, hi):
    """Little-endian 16-bit words from two byte arrays."""
    return lo.astype(np.uint32) | (hi.astype(np.uint32) << 8)


def f16_bits_to_f32(h):
    """IEEE binary16 bit patterns (any integer array) to float32, exactly, NaN payloads kept."""
    h = np.asarray(h, dtype=np.uint32)
    sign = (h >> 15) << 31
    exponent = (h >> 10) & 0x1F
    fraction = h & 0x3FF
    normal = ((exponent + 112) << 23) | (fraction << 13)  # rebias 15 -> 127
    special = np.uint32(0x7F800000) | (fraction << 13)  # infinity and NaN
    # Subnormal and zero: fraction * 2^-24, exact in float32.
    tiny = (fraction.astype(F32) * F32(2.0**-24)).view(np.uint32)
    bits = np.where(exponent == 31, special, np.where(exponent == 0, tiny, normal))
    return (bits.astype(np.uint32) | sign).view(F32)


def f16_field(blocks, offset):
    """The f16 at `offset` of every block, as a float32 column (blocks, 1)."""
    return f16_bits_to_f32(u16_le(blocks[:, offset], blocks[:, offset + 1]))[:, None]


def u32_field(blocks, offset):
    b = blocks[:, offset:offset + 4].astype(np.uint32)
    return b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)


def nibbles_32(qs):
    """16 bytes per block -> 32 codes: weight i is byte i's low nibble, weight i + 16 its high."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32)


def fifth_bits_32(qh):
    """A u32 per block -> bit i of it for weights i = 0..31, as 0 or 16."""
    return (((qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.int32)


def add_first_nan_wins(a, b):
    return np.where(np.isnan(a), a, a + b)


def q8_0(blocks):
    d = f16_field(blocks, 0)
    q = blocks[:, 2:34].view(np.int8).astype(F32)
    return q * d


def q4_0(blocks):
    d = f16_field(blocks, 0)
    return (nibbles_32(blocks[:, 2:18]) - 8).astype(F32) * d


def q4_1(blocks):
    d, m = f16_field(blocks, 0), f16_field(blocks, 2)
    return add_first_nan_wins(nibbles_32(blocks[:, 4:20]).astype(F32) * d, m)


def q5_0(blocks):
    d = f16_field(blocks, 0)
    q = nibbles_32(blocks[:, 6:22]) | fifth_bits_32(u32_field(blocks, 2))
    return (q - 16).astype(F32) * d


def q5_1(blocks):
    d, m = f16_field(blocks, 0), f16_field(blocks, 2)
    q = nibbles_32(blocks[:, 8:24]) | fifth_bits_32(u32_field(blocks, 4))
    return add_first_nan_wins(q.astype(F32) * d, m)


def k_scales_and_mins(packed):
    """12 bytes per block -> the 8 sub-blocks' 6-bit scales and mins, (blocks, 8) each.

    Sub-blocks 0..3: low 6 bits of bytes 0..3 (scales) and 4..7 (mins). Sub-blocks 4..7: low
    nibble (scale) and high nibble (min) of bytes 8..11, their top two bits the top two bits of
    bytes 0..3 (scales) and 4..7 (mins).
    """
    p = packed.astype(np.int32)
    first_sc, first_m = p[:, 0:4] & 63, p[:, 4:8] & 63
    last_sc = (p[:, 8:12] & 15) | ((p[:, 0:4] >> 6) << 4)
    last_m = (p[:, 8:12] >> 4) | ((p[:, 4:8] >> 6) << 4)
    return (np.concatenate([first_sc, last_sc], axis=1),
            np.concatenate([first_m, last_m], axis=1))


def q4_k_or_q5_k(blocks, five):
    n = blocks.shape[0]
    d, dmin = f16_field(blocks, 0), f16_field(blocks, 2)
    sc, m = k_scales_and_mins(blocks[:, 4:16])
    qs = blocks[:, 48:176] if five else blocks[:, 16:144]
    # 4 runs of 32 bytes; sub-block 2r takes run r's low nibbles, 2r + 1 its high ones.
    runs = qs.reshape(n, 4, 1, 32)
    q = np.concatenate([runs & 0x0F, runs >> 4], axis=2).reshape(n, 8, 32).astype(np.int32)
    if five:  # bit j of byte i of qh: the fifth bit of sub-block j's weight i
        qh = blocks[:, 16:48].astype(np.int32)
        q |= ((qh[:, None, :] >> np.arange(8)[None, :, None]) & 1) << 4
    step = d * sc.astype(F32)  # (blocks, 8)
    offset = dmin * m.astype(F32)
    return (step[:, :, None] * q.astype(F32) - offset[:, :, None]).reshape(n, 256)


def q4_k(blocks):
    return q4_k_or_q5_k(blocks, False)


def q5_k(blocks):
    return q4_k_or_q5_k(blocks, True)


def q6_k(blocks):
    """ql[128], qh[64], int8 scales[16], f16 d at 208.

    Each half h of 128 weights uses ql[64h .. 64h + 64) and qh[32h .. 32h + 32): its quarter t
    (32 weights, index i) takes the low nibble of ql byte 64h + 32 (t % 2) + i for t < 2, the high
    one for t >= 2, and bits 2t, 2t + 1 of qh byte 32h + i as its bits 4 and 5.
    """
    n = blocks.shape[0]
    ql = blocks[:, 0:128].reshape(n, 2, 1, 2, 32)  # (half, -, t % 2, i)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(n, 2, 4, 32)  # t = 2 (t//2) + t%2
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    top = (qh >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
    q = ((low.astype(np.int32) | (top.astype(np.int32) << 4)) - 32).reshape(n, 16, 16)
    sc = blocks[:, 192:208].view(np.int8).astype(F32)  # one per 16 weights
    d = f16_field(blocks, 208)
    step = d * sc
    return (step[:, :, None] * q.astype(F32)).reshape(n, 256)


BLOCKS = {  # name: (bytes per block, weights per block, decoder)
    "q8_0": (34, 32, q8_0),
    "q4_0": (18, 32, q4_0),
    "q4_1": (20, 32, q4_1),
    "q5_0": (22, 32, q5_0),
    "q5_1": (24, 32, q5_1),
    "q4_k": (144, 256, q4_k),
    "q5_k": (176, 256, q5_k),
    "q6_k": (210, 256, q6_k),
}


def dequantize(name, data):
    raw = np.frombuffer(data, dtype=np.uint8)
    if name == "f32":
        return raw.view("<f4").astype(F32)
    if name == "f16":
        return f16_bits_to_f32(raw.view("<u2"))
    if name == "bf16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(F32)
    if name not in BLOCKS:
        raise SystemExit(f"unknown format {name!r}")
    size, weights, decode = BLOCKS[name]
    if len(raw) % size:
        raise SystemExit(f"{name}: {len(raw)} bytes is not a whole number of {size}-byte blocks")
    out = decode(raw.reshape(-1, size))
    assert out.dtype == F32 and out.shape == (len(raw) // size, weights), (out.dtype, out.shape)
    return out.reshape(-1)


def main(argv):
    if len(argv) < 3 or len(argv) % 3:
        raise SystemExit(__doc__)
    for name, src, dst in zip(argv[0::3], argv[1::3], argv[2::3]):
        with open(src, "rb") as f:
            data = f.read()
        with np.errstate(all="ignore"):  # inf * 0 and NaN scales are part of the tests
            values = dequantize(name, data)
        with open(dst, "wb") as f:
            f.write(values.astype("<f4").tobytes())


if __name__ == "__main__":
    main(sys.argv[1:])
