//===- LaunchMetadata.cpp - reading and checking an entry's metadata ------===//

#include "epic/runtime/LaunchMetadata.h"

#include "epic/Dialect/EP/IR/EPWindow.h"

#include "epic/runtime/Json.h"

#include <set>
#include <stdexcept>

using namespace epic;
using epic::runtime::Json;

namespace {

/// Reads a value of one LaunchMetadata.def kind; `key` names it in errors.
struct Reader {
  const std::string &what;

  [[noreturn]] void fail(const std::string &key, const std::string &message) const {
    throw std::runtime_error("kernels " + what + ": launch metadata \"" + key + "\" " + message);
  }
  template <typename T, typename F> T read(const std::string &key, F f) const {
    try {
      return f();
    } catch (const std::runtime_error &e) {
      fail(key, std::string("is not what it must be: ") + e.what());
    }
  }

  void get(const std::string &key, const Json &v, int64_t &out) const {
    out = read<int64_t>(key, [&] { return v.integer(); });
  }
  void get(const std::string &key, const Json &v, bool &out) const {
    int64_t value = read<int64_t>(key, [&] { return v.integer(); });
    if (value != 0 && value != 1)
      fail(key, "must be 0 or 1, not " + std::to_string(value));
    out = value != 0;
  }
  void get(const std::string &key, const Json &v, std::string &out) const {
    out = read<std::string>(key, [&] { return v.text(); });
  }
  void get(const std::string &key, const Json &v, std::vector<std::string> &out) const {
    out.clear();
    for (const Json &e : read<std::vector<Json>>(key, [&] { return v.list(); }))
      out.push_back(read<std::string>(key, [&] { return e.text(); }));
  }
  void get(const std::string &key, const Json &v, std::vector<int64_t> &out) const {
    out.clear();
    for (const Json &e : read<std::vector<Json>>(key, [&] { return v.list(); }))
      out.push_back(read<int64_t>(key, [&] { return e.integer(); }));
  }
  void get(const std::string &key, const Json &v, IntOrField &out) const {
    out = IntOrField{};
    if (v.kind == Json::Kind::string)
      out.field = v.string;
    else
      out.value = read<int64_t>(key, [&] { return v.integer(); });
  }
  void get(const std::string &key, const Json &v, std::vector<TensorMapSpec> &out) const {
    out.clear();
    for (const Json &e : read<std::vector<Json>>(key, [&] { return v.list(); })) {
      if (e.kind != Json::Kind::object)
        fail(key, "must list objects");
      TensorMapSpec map;
      size_t known = 0;
#define EP_LAUNCH_MAP_FIELD(member, name, Kind)                                                    \
  if (!e.object.count(name))                                                                       \
    fail(key, std::string("has a map without \"") + name + "\"");                                  \
  get(key + "." + name, e.object.at(name), map.member);                                            \
  ++known;
#include "epic/runtime/LaunchMetadata.def"
      if (e.object.size() != known)
        fail(key, "has a map with a key LaunchMetadata.def does not name");
      out.push_back(std::move(map));
    }
  }
};

} // namespace

LaunchMetadata epic::runtime::readLaunchMetadata(const Json &entry, const std::string &what) {
  Reader reader{what};
  if (entry.kind != Json::Kind::object)
    throw std::runtime_error("kernels " + what + ": an entry of the metadata is not an object");
  LaunchMetadata md;
  std::set<std::string> known{"name"}; // the launch function's symbol
#define EP_LAUNCH_FIELD(member, name, Kind, required, absent)                                      \
  known.insert(name);                                                                              \
  if (entry.object.count(name))                                                                    \
    reader.get(name, entry.object.at(name), md.member);                                            \
  else if (required)                                                                               \
    reader.fail(name, "is missing");
#include "epic/runtime/LaunchMetadata.def"
  for (const auto &[key, value] : entry.object)
    if (!known.count(key))
      reader.fail(key, "is not a launch field this runtime knows (LaunchMetadata.def): the "
                       "kernels were compiled by another version of epic");

  // What the launch relies on.
  if (md.kernels.empty())
    reader.fail("kernels", "is empty");
  if (md.threads < 1 || md.threads > 1024)
    reader.fail("threads", "must be in [1, 1024], not " + std::to_string(md.threads));
  if (md.maxBlocksPerRank < 1)
    reader.fail("max_blocks_per_rank", "must be positive");
  // Records are 8-byte fields (and TMA descriptors) on 64-byte boundaries.
  if (md.paramStride % 64 || md.paramStride < int64_t(8 * md.paramFields.size()))
    reader.fail("param_stride", std::to_string(md.paramStride) + " cannot hold " +
                                    std::to_string(md.paramFields.size()) +
                                    " 8-byte fields in 64-byte records");
  if (md.windowBytes < 0 || md.windowBytesPerToken < 0)
    reader.fail("window_bytes", "must not be negative");
  if (md.windowBytesPerWarp < 0)
    reader.fail("window_bytes_per_warp", "must not be negative");
  if (md.ginSignals < 0)
    reader.fail("gin_signals", "must not be negative");
  if (md.windowScratchAt != -1 &&
      (md.windowScratchAt < epic::ep::window::kControlEnd || md.windowScratchAt > md.windowBytes))
    reader.fail("window_scratch_at",
                std::to_string(md.windowScratchAt) + " is outside the window's data region");
  if (md.ctasPerSm < 1 || md.ctasPerSm > 32)
    reader.fail("ctas_per_sm", "must be in [1, 32]");
  if (md.dynamicSharedBytes < 0)
    reader.fail("dynamic_shared_bytes", "must not be negative");
  const std::vector<int64_t> &c = md.clusterDims;
  if (c.size() != 3 || c[1] != 1 || c[2] != 1 || c[0] < 1 || c[0] > 16)
    reader.fail("cluster_dims",
                "must be [x, 1, 1] with x in [1, 16] (the grid is one-dimensional)");
  for (const TensorMapSpec &map : md.tensorMaps)
    if (map.offset % 64 || map.offset < int64_t(8 * md.paramFields.size()) ||
        map.offset + LaunchMetadata::kTensorMapBytes > md.paramStride)
      reader.fail("tensor_maps", "puts the TMA descriptor of " + map.field + " at byte " +
                                     std::to_string(map.offset) +
                                     ", not a 64-byte aligned place after the record's fields");
  return md;
}
