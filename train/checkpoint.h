// Checkpoints: the full (unsharded) float32 model and AdamW state, the step, the model Config and
// the trainer's own training config, in one self-checking file (docs/checkpoint-format.md).
//
// Whoever writes the checkpoint gathers the shards first; the file never depends on the mesh it
// was written from, so a run may resume with another dp/tp decomposition. The data position is
// the step alone: training batches are a pure function of (seed, step) (train/data.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"

namespace pwm::train {

// One named float32 tensor, row-major; values.size() == product(shape) (a scalar has shape {}).
struct TensorData {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;

  int64_t numel() const;
};

struct Checkpoint {
  model::Config config;
  int64_t step = 0;               // optimizer steps taken; also the data position
  std::string train_config_json;  // opaque to this library; the trainer compares it on resume
  std::vector<TensorData> params;
  // AdamW moments: either both empty (no optimizer state) or both with exactly the names and
  // shapes of `params`, in the same order.
  std::vector<TensorData> adam_m, adam_v;
  // Set by load_checkpoint to the file read; used in error messages. Not stored in the file.
  std::string path;

  // The tensor named `name`; throws pwm::Error naming the checkpoint if there is none.
  const TensorData& param(const std::string& name) const;
  const TensorData& m(const std::string& name) const;
  const TensorData& v(const std::string& name) const;
  bool has_optimizer_state() const { return !adam_m.empty(); }
};

// Writes `ckpt` to PATH atomically (common/atomic_file.h): the bytes go to PATH.tmp.<pid>, every
// write checked, which is fsynced, renamed onto PATH, and the directory fsynced. On any failure the temporary file is removed, PATH is
// left as it was, and pwm::Error names PATH and the cause. Malformed tensors (values that do not
// match the shape, duplicate names, moments that do not mirror params) throw before anything is
// written. Values are stored bit for bit, non-finite ones included. Not thread-safe per PATH.
void save_checkpoint(const std::string& path, const Checkpoint& ckpt);

// Reads and verifies PATH: magic, format version, section sizes against the file size, the
// CRC-32 over the whole file, then the header and every tensor's extent. A truncated, corrupt or
// foreign file throws pwm::Error with one line naming PATH and what is wrong.
Checkpoint load_checkpoint(const std::string& path);
// The same checks and decoding on bytes in memory (load_checkpoint = read the file + this; the
// fuzz target calls it directly). `what` names the bytes in messages ("checkpoint PATH"). Every
// tensor's extent must lie inside the data section and no two may overlap. The result's `path`
// is empty.
Checkpoint parse_checkpoint(std::span<const unsigned char> bytes, const std::string& what);

// Throws pwm::Error naming the first model Config field that differs, e.g.
// "checkpoint run/x.ckpt was written for d_model=128 but this run has d_model=256".
void check_compatible(const Checkpoint& ckpt, const model::Config& expected);

// Throws pwm::Error with one line if a parameter (or, with `moments`, an AdamW moment) holds a
// NaN or an infinity, naming the file, the tensor and the element, e.g. "checkpoint c.ckpt holds
// a non-finite value (nan) in parameter layers.0.wq, element 17: ...". A trainer writes no
// checkpoint from a non-finite step (docs/train.md); such a file was written by an older build or
// altered. Resuming needs both (load_resume_checkpoint), evaluating the parameters (pwm_eval).
void check_finite(const Checkpoint& ckpt, bool moments);

// The on-disk format version this build writes and reads.
inline constexpr uint32_t kCheckpointVersion = 1;

// CRC-32 as zlib computes it (reflected polynomial 0xEDB88320, init and final xor 0xFFFFFFFF):
// crc = checkpoint_crc32(0, p, n) for one buffer, chain by passing the previous result.
uint32_t checkpoint_crc32(uint32_t crc, const void* data, size_t n);

}  // namespace pwm::train
