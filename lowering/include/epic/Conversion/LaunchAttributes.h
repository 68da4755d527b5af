//===- LaunchAttributes.h - launch metadata as attributes -------*- C++ -*-===//
//
// A launch function carries its entry's launch metadata as `epic.<name>`
// attributes, one per field of the runtime's LaunchMetadata.def. These two
// functions are the only code that spells them: convert-ep-to-comm writes a
// typed LaunchMetadata with the first, the compiler checks the attributes
// (also those the DSL's code generator wrote) and turns them into the JSON
// the runtime reads with the second.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_CONVERSION_LAUNCHATTRIBUTES_H
#define EPIC_CONVERSION_LAUNCHATTRIBUTES_H

#include "epic/runtime/LaunchMetadata.h"

#include "mlir/IR/Operation.h"
#include "llvm/Support/JSON.h"

namespace epic {

/// Sets `metadata`'s fields on `launch`: the required ones, and the others
/// where they differ from their absent value. Text fields (the config) are
/// attributes the caller sets itself (launchAttributeName).
void setLaunchAttributes(mlir::Operation *launch, const LaunchMetadata &metadata);

/// The JSON object of `launch`'s metadata (its `epic.*` attributes, keyed by
/// field name). Fails, with an error on `launch`, on an `epic.*` attribute
/// LaunchMetadata.def does not name, one of the wrong kind, or a required
/// field missing.
mlir::FailureOr<llvm::json::Object> launchMetadataJson(mlir::Operation *launch);

} // namespace epic

#endif // EPIC_CONVERSION_LAUNCHATTRIBUTES_H
