//===- LaunchAttributes.cpp - launch metadata as attributes ---------------===//

#include "epic/Conversion/LaunchAttributes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"

using namespace mlir;

namespace {

/// One LaunchMetadata.def kind as an attribute (to) and from an attribute to
/// JSON (json: null where the attribute is not of the kind).
struct Int {
  static Attribute to(Builder &b, int64_t v) { return b.getI64IntegerAttr(v); }
  static std::optional<llvm::json::Value> json(Attribute a) {
    if (auto i = dyn_cast<IntegerAttr>(a))
      return i.getInt();
    return std::nullopt;
  }
  static constexpr const char *what = "an integer";
};
struct Flag {
  static Attribute to(Builder &b, bool v) { return b.getI64IntegerAttr(v ? 1 : 0); }
  static std::optional<llvm::json::Value> json(Attribute a) {
    auto i = dyn_cast<IntegerAttr>(a);
    if (i && (i.getInt() == 0 || i.getInt() == 1))
      return i.getInt();
    return std::nullopt;
  }
  static constexpr const char *what = "0 or 1";
};
struct String {
  static Attribute to(Builder &b, const std::string &v) { return b.getStringAttr(v); }
  static std::optional<llvm::json::Value> json(Attribute a) {
    if (auto s = dyn_cast<StringAttr>(a))
      return s.getValue().str();
    return std::nullopt;
  }
  static constexpr const char *what = "a string";
};
template <typename Element> struct ListOf {
  template <typename T> static Attribute to(Builder &b, const std::vector<T> &v) {
    SmallVector<Attribute> elements;
    for (const T &e : v)
      elements.push_back(Element::to(b, e));
    return b.getArrayAttr(elements);
  }
  static std::optional<llvm::json::Value> json(Attribute a) {
    auto array = dyn_cast<ArrayAttr>(a);
    if (!array)
      return std::nullopt;
    llvm::json::Array out;
    for (Attribute e : array) {
      std::optional<llvm::json::Value> v = Element::json(e);
      if (!v)
        return std::nullopt;
      out.push_back(std::move(*v));
    }
    return llvm::json::Value(std::move(out));
  }
};
struct Strings : ListOf<String> {
  static constexpr const char *what = "a list of strings";
};
struct Ints : ListOf<Int> {
  static constexpr const char *what = "a list of integers";
};
struct Text {
  static std::optional<llvm::json::Value> json(Attribute a) {
    std::string text;
    llvm::raw_string_ostream os(text);
    a.print(os);
    return text;
  }
  static constexpr const char *what = "an attribute";
};
struct IntOrField {
  static Attribute to(Builder &b, const epic::IntOrField &v) {
    return v.field.empty() ? Int::to(b, v.value) : String::to(b, v.field);
  }
  static std::optional<llvm::json::Value> json(Attribute a) {
    if (auto v = Int::json(a))
      return v;
    return String::json(a);
  }
};
struct Map {
  static Attribute to(Builder &b, const epic::TensorMapSpec &map) {
    SmallVector<NamedAttribute> entries;
#define EP_LAUNCH_MAP_FIELD(member, name, Kind)                                                    \
  entries.push_back(b.getNamedAttr(name, Kind::to(b, map.member)));
#include "epic/runtime/LaunchMetadata.def"
    return b.getDictionaryAttr(entries);
  }
  static std::optional<llvm::json::Value> json(Attribute a) {
    auto dict = dyn_cast<DictionaryAttr>(a);
    if (!dict)
      return std::nullopt;
    llvm::json::Object out;
#define EP_LAUNCH_MAP_FIELD(member, name, Kind)                                                    \
  {                                                                                                \
    Attribute value = dict.get(name);                                                              \
    std::optional<llvm::json::Value> v = value ? Kind::json(value) : std::nullopt;                 \
    if (!v)                                                                                        \
      return std::nullopt;                                                                         \
    out[name] = std::move(*v);                                                                     \
  }
#include "epic/runtime/LaunchMetadata.def"
    if (out.size() != dict.size())
      return std::nullopt;
    return llvm::json::Value(std::move(out));
  }
};
struct Maps : ListOf<Map> {
  static constexpr const char *what = "a list of tensor maps (field, offset, rows, cols, "
                                      "elem_bytes, box_rows, box_cols, swizzle)";
};

/// Whether a field holds its absent value (then it is not written).
template <typename T> bool isAbsent(const T &value, const T &absent) { return value == absent; }
bool isAbsent(const std::vector<epic::TensorMapSpec> &value,
              const std::vector<epic::TensorMapSpec> &) {
  return value.empty();
}

} // namespace

void epic::setLaunchAttributes(Operation *launch, const LaunchMetadata &metadata) {
  Builder b(launch->getContext());
  static const LaunchMetadata absent;
  auto set = [&](LaunchField field, bool required, bool isAbsent, auto makeAttr) {
    if (required || !isAbsent)
      launch->setAttr(launchAttributeName(field), makeAttr());
  };
#define EP_LAUNCH_SET(member, Kind, required)                                                      \
  set(LaunchField::member, required, isAbsent(metadata.member, absent.member),                     \
      [&] { return Kind::to(b, metadata.member); });
#define EP_LAUNCH_FIELD(member, name, Kind, required, absent)                                      \
  EP_LAUNCH_SET_IF_##Kind(member, Kind, required)
#define EP_LAUNCH_SET_IF_Int EP_LAUNCH_SET
#define EP_LAUNCH_SET_IF_Flag EP_LAUNCH_SET
#define EP_LAUNCH_SET_IF_String EP_LAUNCH_SET
#define EP_LAUNCH_SET_IF_Strings EP_LAUNCH_SET
#define EP_LAUNCH_SET_IF_Ints EP_LAUNCH_SET
#define EP_LAUNCH_SET_IF_Maps EP_LAUNCH_SET
#define EP_LAUNCH_SET_IF_Text(member, Kind, required)
#include "epic/runtime/LaunchMetadata.def"
}

FailureOr<llvm::json::Object> epic::launchMetadataJson(Operation *launch) {
  llvm::json::Object entry;
  llvm::StringRef prefix = kLaunchAttributePrefix;
  for (NamedAttribute attr : launch->getAttrs()) {
    llvm::StringRef name = attr.getName().strref();
    if (!name.consume_front(prefix))
      continue;
    std::optional<llvm::json::Value> value;
    const char *what = nullptr;
#define EP_LAUNCH_FIELD(member, key, Kind, required, absent)                                       \
  if (name == key) {                                                                               \
    value = Kind::json(attr.getValue());                                                           \
    what = Kind::what;                                                                             \
  }
#include "epic/runtime/LaunchMetadata.def"
    if (!what)
      return launch->emitError() << "'" << attr.getName().strref()
                                 << "' is not a launch attribute (LaunchMetadata.def names the "
                                    "fields the runtime reads)";
    if (!value)
      return launch->emitError() << "launch attribute '" << attr.getName().strref() << "' must be "
                                 << what << ", not " << attr.getValue();
    entry[name] = std::move(*value);
  }
#define EP_LAUNCH_FIELD(member, key, Kind, required, absent)                                       \
  if (required && !entry.get(key))                                                                 \
    return launch->emitError() << "the launch function lacks '" << kLaunchAttributePrefix << key   \
                               << "', a field every entry's metadata has";
#include "epic/runtime/LaunchMetadata.def"
  return entry;
}
