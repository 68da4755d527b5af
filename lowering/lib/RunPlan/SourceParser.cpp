//===- SourceParser.cpp - parse MLIR text, keep its diagnostics -----------===//

#include "epic/Support/SourceParser.h"

#include "mlir/Parser/Parser.h"
#include "llvm/Support/MemoryBuffer.h"

using namespace epic;

static llvm::SourceMgr &withBuffer(llvm::SourceMgr &sourceMgr, const std::string &source,
                                   const std::string &sourceName) {
  sourceMgr.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBufferCopy(source, sourceName),
                               llvm::SMLoc());
  return sourceMgr;
}

SourceParser::SourceParser(mlir::MLIRContext &context, const std::string &source,
                           const std::string &sourceName)
    : context(context), handler(withBuffer(sourceMgr, source, sourceName), &context, stream) {}

mlir::OwningOpRef<mlir::ModuleOp> SourceParser::parse() {
  return mlir::parseSourceFile<mlir::ModuleOp>(sourceMgr, &context);
}
