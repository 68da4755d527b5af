//===- EntryBuilder.h - the entry IR of a kernel request --------*- C++ -*-===//
//
// The runtime asks for kernels with a kernel request: JSON with the fields
// of runtime/include/epic/runtime/KernelRequest.def, which the runtime
// writes and this reads. The compiler builds the request's entry function
// here, with the ep ops' builders: the form the fusions and
// convert-ep-to-comm take (lowering/include/epic/Conversion/Passes.td).
// Errors name the request's field as the JSON spells it ("spec.hidden",
// "dispatch.topk_idx_bits").
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_ENTRYBUILDER_H
#define EPIC_ENTRYBUILDER_H

#include "epic/Dialect/EP/IR/EPDialect.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <cstdint>
#include <string>

namespace epic {

/// What a request asks for: one ep op, or a pair the compiler fuses.
enum class KernelKind {
#define EP_REQUEST_KIND(Enumerator, kind, entryName, dispatch, combine, gemm, staticTokenCap)      \
  Enumerator,
#include "epic/runtime/KernelRequest.def"
};

/// A kernel request as read: KernelRequest.def's fields, named and typed as
/// the runtime's KernelRequest holds them.
struct EntryRequest {
#define EP_REQUEST_HEADER(member, name, Type) Type member{};
#include "epic/runtime/KernelRequest.def"
  struct Spec {
#define EP_REQUEST_CONFIG_FIELD(member, name, Type) Type member{};
#define EP_REQUEST_SPEC_FIELD EP_REQUEST_CONFIG_FIELD
#include "epic/runtime/KernelRequest.def"
  } spec;
  struct Dispatch {
#define EP_REQUEST_DISPATCH_FIELD(member, name, Type) Type member{};
#include "epic/runtime/KernelRequest.def"
  } dispatch;
  struct Combine {
#define EP_REQUEST_COMBINE_FIELD(member, name, Type) Type member{};
#include "epic/runtime/KernelRequest.def"
  } combine;
  struct Gemm {
#define EP_REQUEST_GEMM_FIELD(member, name, Type) Type member{};
#include "epic/runtime/KernelRequest.def"
  } gemm;
};

/// The request format this compiler reads.
#define EP_REQUEST_VERSION(number) inline constexpr int kKernelRequestVersion = number;
#include "epic/runtime/KernelRequest.def"

/// Reads a request: first its version (another one is refused, naming both),
/// then every field its kind has, of the .def's type and not negative, and
/// no other field. The error names the field.
llvm::Expected<EntryRequest> parseEntryRequest(llvm::StringRef json);

/// The entry module of `request`: one `func.func @<name>` holding its ep op
/// (or the pair the compiler fuses), its operations at `loc`. Null after an
/// error at `loc` naming the field (a configuration #ep.config refuses, a
/// value the function cannot be built with); the ops are not verified yet.
mlir::OwningOpRef<mlir::ModuleOp> buildEntryModule(const EntryRequest &request, mlir::Location loc);

/// The #ep.config of `spec`, or null after an error at `loc`.
ep::ConfigAttr configOf(const EntryRequest::Spec &spec, mlir::Location loc);
/// `config`'s parameters as a request's "spec" holds them (the rest of the
/// spec left at its default).
EntryRequest::Spec specOf(ep::ConfigAttr config);
/// `config`'s parameters spelled as a request's "spec" spells them: the ep
/// ops of a run plan (lowering/lib/RunPlan).
llvm::json::Object configJson(ep::ConfigAttr config);

} // namespace epic

#endif // EPIC_ENTRYBUILDER_H
