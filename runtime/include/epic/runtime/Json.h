//===- Json.h - the JSON subset of epic-compile's metadata -----*- C++ -*-===//
//
// A small reader for the metadata the compiler writes (objects, arrays,
// strings, numbers, booleans, null), and a writer of the canonical JSON the
// runtime hashes (kernel requests), so the runtime needs no JSON library.
//
//===----------------------------------------------------------------------===//

#ifndef EPIC_RUNTIME_JSON_H
#define EPIC_RUNTIME_JSON_H

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace epic::runtime {

struct Json {
  enum class Kind { null, boolean, number, string, array, object } kind = Kind::null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::map<std::string, Json> object;

  /// Throws std::runtime_error with the offset of the first syntax error.
  static Json parse(const std::string &text);

  /// Member `key` of an object; throws std::runtime_error naming it if absent.
  const Json &at(const std::string &key) const;
  /// The value as an integer, a number, a bool, a string or a list; each throws
  /// std::runtime_error saying what was expected (a fractional or too large
  /// number is not an integer; `true` is not a number).
  int64_t integer() const;
  double real() const;
  bool flag() const;
  const std::string &text() const;
  const std::vector<Json> &list() const;
};

/// Writes one JSON object: compact, its members in the order they are added,
/// so equal contents give equal text (what a cache key needs).
class JsonObjectWriter {
public:
  JsonObjectWriter &add(const std::string &key, int64_t value);
  JsonObjectWriter &add(const std::string &key, int value) { return add(key, int64_t(value)); }
  JsonObjectWriter &add(const std::string &key, bool value);
  JsonObjectWriter &add(const std::string &key, const std::string &value);
  /// Without it a string literal would be written as `true` (a pointer
  /// converts to bool before it converts to std::string).
  JsonObjectWriter &add(const std::string &key, const char *value) {
    return add(key, std::string(value));
  }
  JsonObjectWriter &add(const std::string &key, const JsonObjectWriter &object);
  std::string str() const { return text + "}"; }

private:
  void addKey(const std::string &key);
  std::string text = "{";
};

} // namespace epic::runtime

#endif // EPIC_RUNTIME_JSON_H
