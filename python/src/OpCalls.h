//===- OpCalls.h - epic._C: an op's calls from Python, typed and checked -*- C++ -*-===//
//
// OpCalls.cpp: tensors and dicts from Python made the runtime's types, and
// the per-kind request, check and plan that the bindings of epic._C call.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_PYTHON_OPCALLS_H
#define EPIC_PYTHON_OPCALLS_H

#include "epic/runtime/Calls.h"
#include "epic/runtime/KernelHost.h"
#include "epic/runtime/KernelRequest.h"

#include <pybind11/pybind11.h>

#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace epic::python {
namespace py = pybind11;

[[noreturn]] inline void invalid(const std::string &message) {
  throw std::invalid_argument(message);
}

/// A (DLPack capsule, dtype name) pair as the runtime's DeviceTensor (null for
/// None); a tensor outside CUDA memory is reported in `offDevice` if given.
runtime::DeviceTensor tensorFrom(const std::string &name, const py::handle &entry,
                                 std::string *offDevice = nullptr);

/// Field `key` of a spec or variant dict as T (bool, an integer type or std::string): a
/// missing field (without `fallback`), a value of another type or one T cannot hold is
/// refused naming the field, before anything else reads it.
template <typename T>
T field(const py::dict &d, const char *key, std::optional<T> fallback = std::nullopt) {
  if (!d.contains(key)) {
    if (fallback)
      return *fallback;
    throw py::value_error(std::string("missing field '") + key + "'");
  }
  py::handle v = d[key];
  auto typeName = [&] { return std::string(py::str(py::type::handle_of(v).attr("__name__"))); };
  if constexpr (std::is_same_v<T, bool>) {
    if (!py::isinstance<py::bool_>(v))
      throw py::type_error(std::string(key) + ": expected a bool, got " + typeName());
    return v.cast<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v))
      throw py::type_error(std::string(key) + ": expected an int, got " + typeName());
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow || x < (long long)std::numeric_limits<T>::min() ||
        x > (long long)std::numeric_limits<T>::max())
      throw py::value_error(std::string(key) + ": " + std::string(py::str(v)) +
                            " is out of range [" +
                            std::to_string((long long)std::numeric_limits<T>::min()) + ", " +
                            std::to_string((long long)std::numeric_limits<T>::max()) + "]");
    return T(x);
  } else {
    if (!py::isinstance<py::str>(v))
      throw py::type_error(std::string(key) + ": expected a str, got " + typeName());
    return v.cast<std::string>();
  }
}

/// The EPSpec of Python's spec dict (DeepEP's argument names), validated.
runtime::EPSpec specFrom(const py::dict &d);
/// The request of op `kind` for Python's spec and variant dicts.
runtime::KernelRequest requestFrom(const std::string &kind, const py::dict &spec,
                                   const py::dict &variant);
/// An op's calls checked (`host` null: no GPU needed, returns None) or planned
/// on `host` (a KernelHost::Plan).
py::object planOrCheck(runtime::KernelHost *host, const std::string &kind, const py::dict &spec,
                       const py::dict &variant, const py::list &calls, int blocks, void *stream);
/// (name, dtype, shape) of what a dispatch or combine of `tokens` writes.
py::list outputsOf(const std::string &kind, const py::dict &spec, const py::dict &variant,
                   int64_t tokens);
/// The tensor slots of an op kind's calls, in the order a plan binds them.
std::vector<std::string> slotNamesOf(const std::string &kind);

} // namespace epic::python

#endif // EPIC_PYTHON_OPCALLS_H
