//===- LargeStack.h - run a driver's main on a large stack ---------------===//
//
// MLIR's parser and verifier recurse once per nesting level of the input: a
// file of deeply nested attributes (thousands of levels) overflows the 8 MiB
// main-thread stack and the driver dies with a signal instead of answering.
// The drivers run their main on a thread with a 1 GiB stack (address space
// only: untouched pages cost nothing), enough for ~10^5 levels.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_SUPPORT_LARGESTACK_H
#define EPIC_SUPPORT_LARGESTACK_H

#include "llvm/Support/thread.h"

#include <optional>
#include <utility>

namespace epic {
inline constexpr unsigned kDriverStackBytes = 1u << 30;

/// `body()` on a thread with a kDriverStackBytes stack; its result.
template <typename Body> int runWithLargeStack(Body &&body) {
  int result = 1;
  llvm::thread worker(std::optional<unsigned>(kDriverStackBytes),
                      [&] { result = std::forward<Body>(body)(); });
  worker.join();
  return result;
}
} // namespace epic

#endif // EPIC_SUPPORT_LARGESTACK_H
