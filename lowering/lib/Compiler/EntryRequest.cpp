//===- EntryRequest.cpp - read a kernel request, map its configuration ----===//
//
// The reader of the JSON that the runtime writes (runtime/lib/
// KernelRequest.cpp), from the same field list (KernelRequest.def). A
// request is checked as data here: every field its kind has, of its type,
// and nothing else, so that a misspelled field is an error instead of a
// default. What the values mean is #ep.config's and the ops' verifiers' to
// say once the entry is built.
//
//===----------------------------------------------------------------------===//

#include "epic/EntryBuilder.h"

#include "mlir/Support/DebugStringHelper.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <limits>
#include <optional>

using namespace mlir;
namespace json = llvm::json;

namespace {

#define EP_REQUEST_SECTION(Name, key) constexpr llvm::StringLiteral k##Name##Section = key;
#include "epic/runtime/KernelRequest.def"

/// A row of KernelRequest.def's kinds.
struct KindInfo {
  epic::KernelKind kind;
  llvm::StringLiteral name;
  bool dispatch, combine, gemm;
};
const KindInfo kKinds[] = {
#define EP_REQUEST_KIND(Enumerator, kind, entryName, dispatch, combine, gemm, staticTokenCap)      \
  {epic::KernelKind::Enumerator, kind, dispatch, combine, gemm},
#include "epic/runtime/KernelRequest.def"
};
const KindInfo &infoOf(epic::KernelKind kind) { return kKinds[static_cast<int>(kind)]; }

llvm::Error requestError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), "kernel request: " + message);
}

std::string shown(const json::Value &value) { return llvm::formatv("{0}", value).str(); }

/// The fields of one JSON object (the request or one of its sections), read
/// in the .def's order; the first problem is kept, named by its path.
class ObjectReader {
public:
  ObjectReader(const json::Object &object, llvm::StringRef path) : object(object), path(path) {}

  template <typename T> void read(llvm::StringRef name, T &value) {
    known.push_back(name);
    if (error)
      return;
    const json::Value *field = object.get(name);
    if (!field)
      return fail(name, "missing");
    if (std::optional<std::string> problem = convert(*field, value))
      fail(name, "expected " + *problem + ", got " + shown(*field));
  }
  /// A key the caller reads itself (a section).
  void expect(llvm::StringRef name) { known.push_back(name); }

  /// A key that no field has (a misspelled field is also missing: the
  /// spelling is the news), else the first problem.
  llvm::Error finish() {
    for (const auto &entry : object)
      if (!llvm::is_contained(known, llvm::StringRef(entry.first))) {
        error.reset();
        fail(entry.first, "is not a field here (" + llvm::join(known, ", ") + ")");
        break;
      }
    return error ? requestError(*error) : llvm::Error::success();
  }

private:
  void fail(llvm::StringRef name, const llvm::Twine &problem) {
    if (!error)
      error = (path.empty() ? name.str() : (path + "." + name).str()) + ": " + problem.str();
  }

  /// What was expected, if `value` is not it.
  static std::optional<std::string> convert(const json::Value &value, int64_t &out) {
    std::optional<int64_t> n = value.getAsInteger();
    if (!n || *n < 0)
      return "a non-negative integer";
    out = *n;
    return std::nullopt;
  }
  static std::optional<std::string> convert(const json::Value &value, int &out) {
    int64_t wide = 0;
    if (convert(value, wide) || wide > std::numeric_limits<int>::max())
      return "an integer in [0, 2^31)";
    out = int(wide);
    return std::nullopt;
  }
  static std::optional<std::string> convert(const json::Value &value, bool &out) {
    std::optional<bool> flag = value.getAsBoolean();
    if (!flag)
      return "true or false";
    out = *flag;
    return std::nullopt;
  }
  static std::optional<std::string> convert(const json::Value &value, std::string &out) {
    std::optional<llvm::StringRef> text = value.getAsString();
    if (!text || text->empty())
      return "a non-empty string";
    out = text->str();
    return std::nullopt;
  }
  static std::optional<std::string> convert(const json::Value &value, epic::KernelKind &out) {
    std::optional<llvm::StringRef> text = value.getAsString();
    std::string names;
    for (const KindInfo &info : kKinds) {
      if (text && *text == info.name) {
        out = info.kind;
        return std::nullopt;
      }
      names += (names.empty() ? "" : ", ") + info.name.str();
    }
    return "one of " + names;
  }

  const json::Object &object;
  std::string path;
  llvm::SmallVector<llvm::StringRef> known; ///< in the .def's order, for errors
  std::optional<std::string> error;
};

/// The section `key` of `root` into `read` (an ObjectReader of it), if the
/// kind has it; a section the kind does not have is an error.
template <typename ReadFields>
llvm::Error readSection(const json::Object &root, llvm::StringRef key, bool has,
                        llvm::StringRef kind, ReadFields readFields) {
  const json::Value *value = root.get(key);
  if (!has)
    return value ? requestError("a " + kind + " request has no \"" + key + "\" section")
                 : llvm::Error::success();
  const json::Object *section = value ? value->getAsObject() : nullptr;
  if (!section)
    return requestError(
        key + ": " + (value ? "expected an object, got " + shown(*value) : std::string("missing")));
  ObjectReader reader(*section, key);
  readFields(reader);
  return reader.finish();
}

} // namespace

llvm::Expected<epic::EntryRequest> epic::parseEntryRequest(llvm::StringRef text) {
  llvm::Expected<json::Value> parsed = json::parse(text);
  if (!parsed)
    return requestError("not JSON: " + llvm::toString(parsed.takeError()));
  const json::Object *root = parsed->getAsObject();
  if (!root)
    return requestError("expected an object, got " + shown(*parsed));

  // The version first: another version's fields may mean other things.
  EntryRequest request;
  {
    const json::Value *version = root->get("version");
    std::optional<int64_t> number = version ? version->getAsInteger() : std::nullopt;
    if (!number)
      return requestError("version: expected an integer, got " +
                          (version ? shown(*version) : std::string("none")));
    if (*number != kKernelRequestVersion)
      return requestError(llvm::formatv("version {0} is not supported: this compiler reads "
                                        "version {1}",
                                        *number, kKernelRequestVersion));
  }

  ObjectReader top(*root, "");
#define EP_REQUEST_HEADER(member, name, Type) top.read(name, request.member);
#include "epic/runtime/KernelRequest.def"
#define EP_REQUEST_SECTION(Name, key) top.expect(key);
#include "epic/runtime/KernelRequest.def"
  if (llvm::Error error = top.finish())
    return std::move(error);

  const KindInfo &info = infoOf(request.kind);
  if (llvm::Error error = readSection(*root, kSpecSection, true, info.name, [&](ObjectReader &in) {
#define EP_REQUEST_CONFIG_FIELD(member, name, Type) in.read(name, request.spec.member);
#define EP_REQUEST_SPEC_FIELD EP_REQUEST_CONFIG_FIELD
#include "epic/runtime/KernelRequest.def"
      }))
    return std::move(error);
  if (llvm::Error error =
          readSection(*root, kDispatchSection, info.dispatch, info.name, [&](ObjectReader &in) {
#define EP_REQUEST_DISPATCH_FIELD(member, name, Type) in.read(name, request.dispatch.member);
#include "epic/runtime/KernelRequest.def"
          }))
    return std::move(error);
  if (llvm::Error error =
          readSection(*root, kCombineSection, info.combine, info.name, [&](ObjectReader &in) {
#define EP_REQUEST_COMBINE_FIELD(member, name, Type) in.read(name, request.combine.member);
#include "epic/runtime/KernelRequest.def"
          }))
    return std::move(error);
  if (llvm::Error error =
          readSection(*root, kGemmSection, info.gemm, info.name, [&](ObjectReader &in) {
#define EP_REQUEST_GEMM_FIELD(member, name, Type) in.read(name, request.gemm.member);
#include "epic/runtime/KernelRequest.def"
          }))
    return std::move(error);
  return request;
}

epic::EntryRequest::Spec epic::specOf(ep::ConfigAttr config) {
  EntryRequest::Spec spec;
  spec.ranks = int(config.getRanks());
  spec.experts = int(config.getExperts());
  spec.topk = int(config.getTopk());
  spec.hidden = int(config.getHidden());
  spec.dtype = debugString(config.getDtype());
  spec.scalePacks = int(config.getScalePacks());
  spec.expertAlignment = int(config.getExpertAlignment());
  spec.expanded = config.isExpanded();
  spec.numSms = int(config.getNumSms());
  spec.maxTokensPerRank = int(config.getMaxTokensPerRank());
  spec.scaleupRanks = int(config.getScaleupRanks());
  spec.hybrid = config.isHybrid();
  return spec;
}

json::Object epic::configJson(ep::ConfigAttr config) {
  EntryRequest::Spec spec = specOf(config);
  json::Object object;
#define EP_REQUEST_CONFIG_FIELD(member, name, Type) object[name] = spec.member;
#include "epic/runtime/KernelRequest.def"
  return object;
}
