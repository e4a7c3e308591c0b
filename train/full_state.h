// Between a tp rank's parameter buffer and the full (unsharded) tensors that checkpoints and
// weights_hash use. A shard is a contiguous block of rows of the full tensor (params.h), so a
// full tensor is the tp shards concatenated in tp-rank order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "train/checkpoint.h"
#include "model/params.h"

namespace pwm::train {

// Gathers `count` floats from every tp rank into `out` (tp * count floats, rank order). Called
// once per sharded tensor, on every tp rank, in layout order. Empty for tp = 1.
using TpGather = std::function<void(const float* shard, float* out, size_t count)>;

// The full tensors of one buffer in layout order (every tp rank gets them all). Under expert
// parallelism the experts' tensors are gathered the same way over the expert-parallel group
// (`ep_gather`, in ep-rank order; every member calls, once per expert tensor, in layout order).
std::vector<TensorData> gather_full(const model::ParamLayout& layout, const float* buffer,
                                    const TpGather& gather, const TpGather& ep_gather = {});

// Fills this tp rank's buffer from full tensors (a checkpoint's). Throws pwm::Error naming a
// missing tensor or a shape mismatch.
void scatter_full(const model::ParamLayout& layout, const std::vector<TensorData>& full, float* buffer);

// FNV-1a 64 over the names, shapes and float bits of the full tensors, in order: the same for
// every dp/tp decomposition and both trainers. Printed as 16 hex digits.
uint64_t weights_hash(const std::vector<TensorData>& full);
std::string hash_hex(uint64_t h);

}  // namespace pwm::train
