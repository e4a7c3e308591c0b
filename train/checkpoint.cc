#include "train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/check.h"
#include "train/model_json.h"

// File layout (docs/checkpoint-format.md is the byte-exact reference):
//
//   [0, 32)                 preamble: magic "PWMCKPT\0", u32 version, u32 header_bytes H,
//                           u64 data_offset, u64 data_bytes (all little-endian)
//   [32, 32 + H)            JSON header: config, step, train_config, tensor table
//   [32 + H, data_offset)   zero padding; data_offset is a multiple of 64
//   [data_offset, +data_bytes)  tensors, little-endian float32, each at a multiple of 64
//   last 4 bytes            u32 CRC-32 (zlib's) of every byte before it
//
// The CRC sits at the end so the writer can stream: it checksums as it writes and never seeks.
// The preamble carries the section sizes so a truncated file is told apart from a corrupt one
// before the checksum is even computed.

namespace pwm::train {

using namespace pwm::model;  // the Transformer's types and kernels

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kMagic[8] = {'P', 'W', 'M', 'C', 'K', 'P', 'T', '\0'};
constexpr uint64_t kPreambleBytes = 32;
constexpr uint64_t kAlign = 64;
constexpr uint64_t kCrcBytes = 4;

static_assert(std::endian::native == std::endian::little,
              "checkpoint.cc writes host floats as little-endian; add byte swapping for this host");
// Every Config field is serialized and compared from one table (model/config_fields.h). A new
// field changes the size: add its row there, then update this.
static_assert(sizeof(Config) == 144, "Config changed: add the field to model/config_fields.h, then update this");

// ---- CRC-32, slicing by 8 -----------------------------------------------------------------

using CrcTables = std::array<std::array<uint32_t, 256>, 8>;

constexpr CrcTables make_crc_tables() {
  CrcTables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (int s = 1; s < 8; ++s)
    for (uint32_t i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  return t;
}

constexpr CrcTables kCrc = make_crc_tables();

uint32_t load_u32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // little-endian host (static_assert above)
}
uint64_t load_u64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
void store_u32(unsigned char* p, uint32_t v) { std::memcpy(p, &v, 4); }
void store_u64(unsigned char* p, uint64_t v) { std::memcpy(p, &v, 8); }

uint64_t align_up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// ---- Structural checks shared by save and load --------------------------------------------

int64_t shape_numel(const std::vector<int64_t>& shape, const std::string& where) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) PWM_THROW("{}: negative dimension {}", where, d);
    if (d != 0 && n > (int64_t{1} << 40) / d)
      PWM_THROW("{}: shape has more than 2^40 elements", where);
    n *= d;
  }
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// `what` names the checkpoint in messages ("checkpoint PATH").
void check_tensors(const Checkpoint& c, const std::string& what) {
  auto check_group = [&](const std::vector<TensorData>& g, const char* group) {
    std::set<std::string> names;
    for (const auto& t : g) {
      const std::string where = fmt::format("{}: {} tensor '{}'", what, group, t.name);
      if (t.name.empty()) PWM_THROW("{}: a {} tensor has an empty name", what, group);
      if (!names.insert(t.name).second) PWM_THROW("{} appears twice", where);
      const int64_t n = shape_numel(t.shape, where);
      if (n != static_cast<int64_t>(t.values.size()))
        PWM_THROW("{} has shape {} ({} values) but holds {} values", where, shape_str(t.shape), n,
                  t.values.size());
    }
  };
  if (c.step < 0) PWM_THROW("{}: negative step {}", what, c.step);
  check_group(c.params, "params");
  check_group(c.adam_m, "adam_m");
  check_group(c.adam_v, "adam_v");
  if (c.adam_m.empty() != c.adam_v.empty())
    PWM_THROW("{}: has {} AdamW first moments but {} second moments", what, c.adam_m.size(),
              c.adam_v.size());
  if (c.adam_m.empty()) return;
  auto mirrors = [&](const std::vector<TensorData>& g, const char* group) {
    if (g.size() != c.params.size())
      PWM_THROW("{}: has {} params but {} {} tensors", what, c.params.size(), g.size(), group);
    for (size_t i = 0; i < g.size(); ++i)
      if (g[i].name != c.params[i].name || g[i].shape != c.params[i].shape)
        PWM_THROW("{}: {} tensor {} is '{}' {} but param {} is '{}' {}", what, group, i,
                  g[i].name, shape_str(g[i].shape), i, c.params[i].name,
                  shape_str(c.params[i].shape));
  };
  mirrors(c.adam_m, "adam_m");
  mirrors(c.adam_v, "adam_v");
}

// ---- Writing ------------------------------------------------------------------------------

// Writes through an AtomicFile (which buffers and checks every write), checksumming every byte.
class CrcWriter {
 public:
  explicit CrcWriter(AtomicFile& f) : f_(f) {}
  void write(const void* data, size_t n) {
    crc_ = checkpoint_crc32(crc_, data, n);
    f_.write(data, n);
    written_ += n;
  }
  void zeros(size_t n) {
    static constexpr char kZeros[kAlign] = {};
    while (n > 0) {
      const size_t k = std::min<size_t>(n, kAlign);
      write(kZeros, k);
      n -= k;
    }
  }
  uint32_t crc() const { return crc_; }
  uint64_t written() const { return written_; }

 private:
  AtomicFile& f_;
  uint32_t crc_ = 0;
  uint64_t written_ = 0;
};

struct Entry {
  const char* group;
  const TensorData* t;
  uint64_t offset;  // relative to data_offset
  uint64_t bytes;
};

void write_file(AtomicFile& f, const Checkpoint& c) {
  std::vector<Entry> entries;
  uint64_t data_bytes = 0;
  auto add = [&](const std::vector<TensorData>& g, const char* group) {
    for (const auto& t : g) {
      data_bytes = align_up(data_bytes);
      entries.push_back({group, &t, data_bytes, t.values.size() * sizeof(float)});
      data_bytes += t.values.size() * sizeof(float);
    }
  };
  add(c.params, "params");
  add(c.adam_m, "adam_m");
  add(c.adam_v, "adam_v");

  json table = json::array();
  for (const auto& e : entries)
    table.push_back({{"group", e.group},
                     {"name", e.t->name},
                     {"shape", e.t->shape},
                     {"dtype", "float32"},
                     {"offset", e.offset},
                     {"bytes", e.bytes}});
  const json header = {{"format", "pwm-checkpoint"},
                       {"version", kCheckpointVersion},
                       {"config", model_to_json(c.config)},
                       {"step", c.step},
                       {"train_config", c.train_config_json},
                       {"tensors", std::move(table)}};
  const std::string text = header.dump();
  PWM_CHECK_LT(text.size(), uint64_t{1} << 31);
  const uint64_t data_offset = align_up(kPreambleBytes + text.size());

  unsigned char pre[kPreambleBytes];
  std::memcpy(pre, kMagic, 8);
  store_u32(pre + 8, kCheckpointVersion);
  store_u32(pre + 12, static_cast<uint32_t>(text.size()));
  store_u64(pre + 16, data_offset);
  store_u64(pre + 24, data_bytes);

  CrcWriter w(f);
  w.write(pre, sizeof(pre));
  w.write(text.data(), text.size());
  w.zeros(data_offset - kPreambleBytes - text.size());
  uint64_t pos = 0;
  for (const auto& e : entries) {
    w.zeros(e.offset - pos);
    w.write(e.t->values.data(), e.bytes);
    pos = e.offset + e.bytes;
  }
  PWM_CHECK_EQ(pos, data_bytes);
  unsigned char crc[kCrcBytes];
  store_u32(crc, w.crc());
  w.write(crc, sizeof(crc));
  PWM_CHECK_EQ(w.written(), data_offset + data_bytes + kCrcBytes);
}

// ---- Reading ------------------------------------------------------------------------------

std::vector<unsigned char> read_all(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) PWM_THROW("checkpoint {}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd);
    PWM_THROW("checkpoint {}: {}", path,
              S_ISDIR(st.st_mode) ? "is a directory, not a checkpoint file" : std::strerror(err));
  }
  std::vector<unsigned char> bytes(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t k = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      const int err = errno;
      ::close(fd);
      PWM_THROW("checkpoint {}: cannot read: {}", path, std::strerror(err));
    }
    if (k == 0) break;  // shrank while reading: the size checks below report it
    done += static_cast<size_t>(k);
  }
  bytes.resize(done);
  ::close(fd);
  return bytes;
}

std::vector<TensorData>& group_of(Checkpoint& c, const std::string& group,
                                  const std::string& what) {
  if (group == "params") return c.params;
  if (group == "adam_m") return c.adam_m;
  if (group == "adam_v") return c.adam_v;
  PWM_THROW("{}: unknown tensor group '{}' in the header", what, group);
}

const TensorData& find(const std::vector<TensorData>& g, const std::string& name,
                       const Checkpoint& c, const char* kind) {
  for (const auto& t : g)
    if (t.name == name) return t;
  PWM_THROW("checkpoint {} has no {} '{}'", c.path.empty() ? "(in memory)" : c.path, kind, name);
}

}  // namespace

uint32_t checkpoint_crc32(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (n >= 8) {
    const uint32_t lo = load_u32(p) ^ crc;
    const uint32_t hi = load_u32(p + 4);
    crc = kCrc[7][lo & 0xFF] ^ kCrc[6][(lo >> 8) & 0xFF] ^ kCrc[5][(lo >> 16) & 0xFF] ^
          kCrc[4][lo >> 24] ^ kCrc[3][hi & 0xFF] ^ kCrc[2][(hi >> 8) & 0xFF] ^
          kCrc[1][(hi >> 16) & 0xFF] ^ kCrc[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = kCrc[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

int64_t TensorData::numel() const { return shape_numel(shape, "tensor '" + name + "'"); }

const TensorData& Checkpoint::param(const std::string& name) const {
  return find(params, name, *this, "parameter");
}
const TensorData& Checkpoint::m(const std::string& name) const {
  return find(adam_m, name, *this, "AdamW first moment");
}
const TensorData& Checkpoint::v(const std::string& name) const {
  return find(adam_v, name, *this, "AdamW second moment");
}

void save_checkpoint(const std::string& path, const Checkpoint& ckpt) {
  check_tensors(ckpt, "checkpoint " + path);
  // Complete or absent: any failure removes the temporary file and leaves PATH as it was.
  AtomicFile f(path, "checkpoint");
  write_file(f, ckpt);
  f.commit();
}

Checkpoint load_checkpoint(const std::string& path) {
  const std::vector<unsigned char> f = read_all(path);
  Checkpoint c = parse_checkpoint(std::span<const unsigned char>(f), "checkpoint " + path);
  c.path = path;
  return c;
}

Checkpoint parse_checkpoint(std::span<const unsigned char> f, const std::string& what) {
  const uint64_t size = f.size();

  // Magic first, on as many bytes as exist, so a foreign file is not called "truncated".
  if (size == 0) PWM_THROW("{}: truncated: the file is empty", what);
  if (std::memcmp(f.data(), kMagic, std::min<uint64_t>(size, 8)) != 0)
    PWM_THROW("{}: not a pwm checkpoint (bad magic; expected \"PWMCKPT\\0\")", what);
  if (size < kPreambleBytes + kCrcBytes)
    PWM_THROW("{}: truncated: {} bytes, shorter than the {}-byte preamble and checksum", what,
              size, kPreambleBytes + kCrcBytes);
  const uint32_t version = load_u32(f.data() + 8);
  if (version != kCheckpointVersion)
    PWM_THROW("{}: format version {}, but this build reads version {}", what, version,
              kCheckpointVersion);
  const uint64_t header_bytes = load_u32(f.data() + 12);
  const uint64_t data_offset = load_u64(f.data() + 16);
  const uint64_t data_bytes = load_u64(f.data() + 24);
  if (data_offset % kAlign != 0 || data_offset < kPreambleBytes + header_bytes ||
      data_offset - (kPreambleBytes + header_bytes) >= kAlign)
    PWM_THROW("{}: corrupt preamble: header of {} bytes and data offset {} are inconsistent",
              what, header_bytes, data_offset);
  // Overflow-safe: expected = data_offset + data_bytes + 4.
  const bool fits = data_offset <= size && data_bytes <= size - data_offset &&
                    size - data_offset - data_bytes >= kCrcBytes;
  if (!fits || size - data_offset - data_bytes != kCrcBytes) {
    if (data_offset > (uint64_t{1} << 62) || data_bytes > (uint64_t{1} << 62))
      PWM_THROW("{}: corrupt preamble: data offset {} / size {} are implausible", what,
                data_offset, data_bytes);
    const uint64_t expected = data_offset + data_bytes + kCrcBytes;
    if (size < expected)
      PWM_THROW("{}: truncated: the preamble promises {} bytes but the file has {}", what,
                expected, size);
    PWM_THROW("{}: {} unexpected bytes after the end the preamble promises ({} bytes)", what,
              size - expected, expected);
  }
  const uint32_t stored = load_u32(f.data() + size - kCrcBytes);
  const uint32_t computed = checkpoint_crc32(0, f.data(), size - kCrcBytes);
  if (stored != computed)
    PWM_THROW("{}: checksum mismatch (stored {:08x}, computed {:08x}): the file is corrupt", what,
              stored, computed);

  Checkpoint c;
  std::vector<std::pair<uint64_t, uint64_t>> extents;  // [offset, offset + bytes) of every tensor
  try {
    const json h = json::parse(f.begin() + kPreambleBytes,
                               f.begin() + static_cast<std::ptrdiff_t>(kPreambleBytes + header_bytes));
    if (h.at("format").get<std::string>() != "pwm-checkpoint")
      PWM_THROW("{}: header format is not pwm-checkpoint", what);
    if (h.at("version").get<uint32_t>() != version)
      PWM_THROW("{}: header version disagrees with the preamble", what);
    c.config = model_from_json(h.at("config"));
    c.step = h.at("step").get<int64_t>();
    c.train_config_json = h.at("train_config").get<std::string>();
    for (const auto& e : h.at("tensors")) {
      TensorData t;
      t.name = e.at("name").get<std::string>();
      t.shape = e.at("shape").get<std::vector<int64_t>>();
      const auto group = e.at("group").get<std::string>();
      const std::string where = fmt::format("{}: {} tensor '{}'", what, group, t.name);
      if (e.at("dtype").get<std::string>() != "float32")
        PWM_THROW("{} has dtype {}, only float32 is supported", where,
                  e.at("dtype").get<std::string>());
      const auto offset = e.at("offset").get<uint64_t>();
      const auto bytes = e.at("bytes").get<uint64_t>();
      const int64_t n = shape_numel(t.shape, where);
      if (bytes != static_cast<uint64_t>(n) * sizeof(float))
        PWM_THROW("{} has shape {} but {} bytes", where, shape_str(t.shape), bytes);
      if (offset % sizeof(float) != 0 || offset > data_bytes || bytes > data_bytes - offset)
        PWM_THROW("{} lies outside the data section ({} bytes at offset {}, section of {})", where,
                  bytes, offset, data_bytes);
      extents.push_back({offset, offset + bytes});
      t.values.resize(static_cast<size_t>(n));
      if (bytes) std::memcpy(t.values.data(), f.data() + data_offset + offset, bytes);  // (empty: data() may be null)
      group_of(c, group, what).push_back(std::move(t));
    }
  } catch (const json::exception& e) {
    PWM_THROW("{}: malformed header: {}", what, e.what());
  }
  // Every tensor owns its bytes: two table entries over the same bytes are a forged or corrupt
  // table (its CRC may still be right), not two tensors.
  std::sort(extents.begin(), extents.end());
  std::pair<uint64_t, uint64_t> reach{0, 0};  // the non-empty extent that ends last so far
  for (const auto& e : extents) {
    if (e.second == e.first) continue;
    if (e.first < reach.second)
      PWM_THROW("{}: corrupt tensor table: tensors at data offsets {} and {} overlap (bytes [{}, {}) and [{}, {}))",
                what, reach.first, e.first, reach.first, reach.second, e.first, e.second);
    if (e.second > reach.second) reach = e;
  }
  check_tensors(c, what);
  return c;
}

void check_compatible(const Checkpoint& ckpt, const Config& expected) {
  const std::string name = ckpt.path.empty() ? "(in memory)" : ckpt.path;
  check_same_model(ckpt.config, expected, name);
}

void check_finite(const Checkpoint& ckpt, bool moments) {
  const std::string name = ckpt.path.empty() ? "(in memory)" : ckpt.path;
  auto check = [&](const std::vector<TensorData>& tensors, const char* kind) {
    for (const TensorData& t : tensors)
      for (size_t i = 0; i < t.values.size(); ++i)
        if (!std::isfinite(t.values[i]))
          PWM_THROW("checkpoint {} holds a non-finite value ({}) in {} {}, element {} (saved from a diverged run, "
                    "or altered): use an earlier checkpoint or start a new run",
                    name, std::isnan(t.values[i]) ? "nan" : t.values[i] > 0 ? "inf" : "-inf", kind, t.name, i);
  };
  check(ckpt.params, "parameter");
  if (!moments) return;
  check(ckpt.adam_m, "AdamW first moment");
  check(ckpt.adam_v, "AdamW second moment");
}

}  // namespace pwm::train
