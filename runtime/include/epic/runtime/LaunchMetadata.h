//===- LaunchMetadata.h - an entry's launch metadata, typed -----*- C++ -*-===//
//
// What the compiler says about one entry's kernels and the runtime needs to
// launch them, with the fields of LaunchMetadata.def. The compiler fills it
// (convert-ep-to-comm) and writes it as attributes and JSON from the same
// file; the runtime reads the JSON back (fromJson). Plain C++: the compiler
// and the runtime both include it, nothing of either links.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_LAUNCHMETADATA_H
#define EPIC_RUNTIME_LAUNCHMETADATA_H

#include <cstdint>
#include <string>
#include <vector>

namespace epic {

/// An integer, or the name of the record field that holds it at launch.
struct IntOrField {
  int64_t value = 0;
  std::string field; ///< non-empty: read from this record field
};

/// A TMA descriptor the runtime encodes into each record (LaunchMetadata.def:
/// EP_LAUNCH_MAP_FIELD).
struct TensorMapSpec {
#define EP_LAUNCH_KIND_Int int64_t
#define EP_LAUNCH_KIND_String std::string
#define EP_LAUNCH_KIND_IntOrField IntOrField
#define EP_LAUNCH_MAP_FIELD(member, name, Kind) EP_LAUNCH_KIND_##Kind member{};
#include "epic/runtime/LaunchMetadata.def"
};

/// One entry's launch metadata (LaunchMetadata.def: EP_LAUNCH_FIELD).
struct LaunchMetadata {
#define EP_LAUNCH_KIND_Flag bool
#define EP_LAUNCH_KIND_Strings std::vector<std::string>
#define EP_LAUNCH_KIND_Ints std::vector<int64_t>
#define EP_LAUNCH_KIND_Text std::string
#define EP_LAUNCH_KIND_Maps std::vector<TensorMapSpec>
#define EP_LAUNCH_FIELD(member, name, Kind, required, absent) EP_LAUNCH_KIND_##Kind member = absent;
#include "epic/runtime/LaunchMetadata.def"
#undef EP_LAUNCH_KIND_Int
#undef EP_LAUNCH_KIND_String
#undef EP_LAUNCH_KIND_IntOrField
#undef EP_LAUNCH_KIND_Flag
#undef EP_LAUNCH_KIND_Strings
#undef EP_LAUNCH_KIND_Ints
#undef EP_LAUNCH_KIND_Text
#undef EP_LAUNCH_KIND_Maps

  /// Bytes of a TMA descriptor in a record (sizeof(CUtensorMap)).
  static constexpr int64_t kTensorMapBytes = 128;
  /// The window the kernels need for a token cap of `maxTokensPerRank` and
  /// `blocksPerRank` blocks per rank as launched (ctas_per_sm included).
  int64_t windowFor(int64_t maxTokensPerRank, int64_t blocksPerRank) const {
    const int64_t warps = blocksPerRank * ((threads + 31) / 32);
    return windowBytes + windowBytesPerToken * maxTokensPerRank + windowBytesPerWarp * warps;
  }
};

/// A field of LaunchMetadata, by member name.
enum class LaunchField {
#define EP_LAUNCH_FIELD(member, name, Kind, required, absent) member,
#include "epic/runtime/LaunchMetadata.def"
};

/// The JSON key of each field (LaunchMetadata.def's order).
inline constexpr const char *kLaunchFieldNames[] = {
#define EP_LAUNCH_FIELD(member, name, Kind, required, absent) name,
#include "epic/runtime/LaunchMetadata.def"
};
/// The launch function's attribute that carries a field: "epic." + its key.
inline constexpr const char kLaunchAttributePrefix[] = "epic.";
inline std::string launchAttributeName(LaunchField field) {
  return std::string(kLaunchAttributePrefix) + kLaunchFieldNames[int(field)];
}

} // namespace epic

namespace epic::runtime {
struct Json;
/// Reads one entry of the compiler's metadata ("entries": [...]) and checks
/// it: every required field there, no key LaunchMetadata.def does not name,
/// each of its kind, and the values the launch relies on (record layout,
/// window, block counts). Throws std::runtime_error naming `what` and the key.
LaunchMetadata readLaunchMetadata(const Json &entry, const std::string &what);
} // namespace epic::runtime

#endif // EPIC_RUNTIME_LAUNCHMETADATA_H
