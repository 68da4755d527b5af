//===- SourceParser.h - parse MLIR text, keep its diagnostics ---*- C++ -*-===//
//
// The compiler library's entry points (compileModule, translateRunProgram)
// take MLIR as text and report errors as exceptions carrying the
// diagnostics with their source locations. This holds what that needs for
// as long as passes may still emit diagnostics.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_SUPPORT_SOURCEPARSER_H
#define EPIC_SUPPORT_SOURCEPARSER_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace epic {

class SourceParser {
public:
  /// Diagnostics of `context` go to diagnostics() from now on.
  SourceParser(mlir::MLIRContext &context, const std::string &source,
               const std::string &sourceName);
  /// The module, or null after a parse error (see diagnostics()).
  mlir::OwningOpRef<mlir::ModuleOp> parse();
  const std::string &diagnostics() const { return text; }

private:
  mlir::MLIRContext &context;
  std::string text;
  llvm::raw_string_ostream stream{text};
  llvm::SourceMgr sourceMgr;
  mlir::SourceMgrDiagnosticHandler handler;
};

} // namespace epic

#endif // EPIC_SUPPORT_SOURCEPARSER_H
