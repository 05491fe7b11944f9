// make-model --inflate-from DIR --inflate-factor R: DIR's model with every routed expert widened
// R times. It computes the same function while a token reads R times the routed experts' bytes:
// a bandwidth-bound model that keeps DIR's trained weights and MTP head (docs/performance.md,
// "Speculative decoding on inflated models").
//
//   expert(x) = down · (silu(gate · x) ⊙ (up · x))      gate, up: [I, H]   down: [H, I]
//   widened:    gate' = [gate; ...; gate]                [R·I, H]  (R copies of the rows)
//               up'   = [up; ...; up]                    [R·I, H]
//               down' = [down / R, ..., down / R]        [H, R·I]  (R copies of the columns)
//   down' · (silu(gate' x) ⊙ (up' x)) = Σ_r (down / R) · h = down · h
//
// Exact in real numbers; in floats the R partial sums of each output round differently, so logits
// agree to float rounding. R is a power of two, so down / R is exact in bf16, f16 and f32. The
// router, top-k, shared expert, attention, MTP layers' other weights and the tokenizer files are
// copied as they are; config.json's moe_intermediate_size becomes R·I.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace moeserve::cli {

// Writes the inflated model of the folder `from` to the folder `out` (created; not `from`).
// InvalidArgument for a factor that is not a power of two in 2..1024, a model without routed
// experts, or expert weights stored another way (fused, quantized) — naming the tensor.
Status InflateModel(const std::string& from, int64_t factor, const std::string& out,
                    uint64_t max_shard_bytes);

}  // namespace moeserve::cli
