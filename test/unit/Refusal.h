//===- Refusal.h - what a refused call said, for the unit tests -*- C++ -*-===//

#ifndef EPIC_TEST_UNIT_REFUSAL_H
#define EPIC_TEST_UNIT_REFUSAL_H

#include <stdexcept>
#include <string>

namespace epic::test {

/// The message of the std::invalid_argument `make` throws, or "".
template <typename Make> std::string refusal(Make make) {
  try {
    make();
  } catch (const std::invalid_argument &e) {
    return e.what();
  }
  return "";
}

} // namespace epic::test

#endif // EPIC_TEST_UNIT_REFUSAL_H
