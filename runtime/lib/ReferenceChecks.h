//===- ReferenceChecks.h - what the host checks share ------------*- C++ -*-===//
//
// The pieces every check of Reference.h uses: a bounded problem list, the
// configuration's sizes, row tests and the "rank r: field[i]" prefix. Private
// to runtime/lib (Reference.cpp, ReferenceExperts.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_LIB_REFERENCECHECKS_H
#define EPIC_RUNTIME_LIB_REFERENCECHECKS_H

#include "epic/runtime/Reference.h"

#include <algorithm>
#include <string>
#include <vector>

namespace epic::runtime::checks {

/// Collects at most `limit` problems; more are counted, not kept.
struct Problems {
  size_t limit;
  std::vector<std::string> list;
  size_t more = 0;
  bool add(const std::string &text) {
    if (list.size() < limit)
      list.push_back(text);
    else
      ++more;
    return false;
  }
  std::vector<std::string> result() {
    if (more)
      list.push_back("... and " + std::to_string(more) + " more");
    return std::move(list);
  }
};

struct World {
  int64_t R, E, L, K, Tmax, A;
  explicit World(const EPSpec &s)
      : R(s.ranks), E(s.experts), L(s.experts / s.ranks), K(s.topk), Tmax(s.maxTokensPerRank),
        A(s.expertAlignment) {}
  int64_t align(int64_t n) const { return (n + A - 1) / A * A; }
};

inline bool rowIsZero(const HostTensor &a, int64_t i) {
  const uint8_t *p = a.row(i);
  return std::all_of(p, p + a.rowBytes(), [](uint8_t b) { return b == 0; });
}

inline std::string where(int64_t rank, const char *field, int64_t row) {
  return "rank " + std::to_string(rank) + ": " + field + "[" + std::to_string(row) + "]";
}

} // namespace epic::runtime::checks

#endif // EPIC_RUNTIME_LIB_REFERENCECHECKS_H
