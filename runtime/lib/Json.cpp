//===- Json.cpp - the JSON subset of epic-compile's metadata --------------===//

#include "epic/runtime/Json.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

using namespace epic::runtime;

namespace {
struct Reader {
  const std::string &text;
  size_t at = 0;

  [[noreturn]] void fail(const std::string &what) {
    throw std::runtime_error("metadata JSON: " + what + " at offset " + std::to_string(at));
  }
  void skip() {
    while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at])))
      ++at;
  }
  bool take(char c) {
    skip();
    if (at < text.size() && text[at] == c) {
      ++at;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c))
      fail(std::string("expected '") + c + "'");
  }
  std::string str() {
    expect('"');
    std::string out;
    while (at < text.size() && text[at] != '"') {
      char c = text[at++];
      if (c == '\\') {
        if (at >= text.size())
          fail("unterminated escape");
        char e = text[at++];
        switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'u':
          out += '?';
          at += 4;
          break; // not produced by epic-compile
        default:
          out += e;
        }
      } else {
        out += c;
      }
    }
    expect('"');
    return out;
  }
  Json value() {
    skip();
    Json v;
    if (at >= text.size())
      fail("unexpected end");
    char c = text[at];
    if (c == '{') {
      ++at;
      v.kind = Json::Kind::object;
      if (take('}'))
        return v;
      do {
        std::string key = str();
        expect(':');
        v.object[key] = value();
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      ++at;
      v.kind = Json::Kind::array;
      if (take(']'))
        return v;
      do
        v.array.push_back(value());
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::Kind::string;
      v.string = str();
    } else if (text.compare(at, 4, "true") == 0 || text.compare(at, 5, "false") == 0) {
      v.kind = Json::Kind::boolean;
      v.boolean = text[at] == 't';
      at += v.boolean ? 4 : 5;
    } else if (text.compare(at, 4, "null") == 0) {
      at += 4;
    } else {
      char *end = nullptr;
      v.kind = Json::Kind::number;
      v.number = std::strtod(text.c_str() + at, &end);
      if (end == text.c_str() + at)
        fail("unexpected character");
      at = size_t(end - text.c_str());
    }
    return v;
  }
};
} // namespace

Json Json::parse(const std::string &text) {
  Reader reader{text};
  Json v = reader.value();
  reader.skip();
  if (reader.at != text.size())
    reader.fail("trailing characters");
  return v;
}

const Json &Json::at(const std::string &key) const {
  auto it = object.find(key);
  if (kind != Kind::object || it == object.end())
    throw std::runtime_error("metadata JSON: no \"" + key + "\"");
  return it->second;
}

namespace {
const char *kindName(Json::Kind kind) {
  switch (kind) {
  case Json::Kind::null:
    return "null";
  case Json::Kind::boolean:
    return "a bool";
  case Json::Kind::number:
    return "a number";
  case Json::Kind::string:
    return "a string";
  case Json::Kind::array:
    return "a list";
  case Json::Kind::object:
    return "an object";
  }
  return "a value";
}
[[noreturn]] void expected(const char *what, const Json &got) {
  std::string shown = got.kind == Json::Kind::number ? " " + std::to_string(got.number) : "";
  throw std::runtime_error(std::string("metadata JSON: expected ") + what + ", got " +
                           kindName(got.kind) + shown);
}
} // namespace

int64_t Json::integer() const {
  // 2^63 itself is not an int64: the bound is exclusive.
  if (kind != Kind::number || number != std::floor(number) || !(std::fabs(number) < 0x1p63))
    expected("an integer", *this);
  return int64_t(number);
}

double Json::real() const {
  if (kind != Kind::number)
    expected("a number", *this);
  return number;
}

bool Json::flag() const {
  if (kind != Kind::boolean)
    expected("a bool", *this);
  return boolean;
}

const std::string &Json::text() const {
  if (kind != Kind::string)
    expected("a string", *this);
  return string;
}

const std::vector<Json> &Json::list() const {
  if (kind != Kind::array)
    expected("a list", *this);
  return array;
}

namespace {
/// `text` as a JSON string: quotes, backslashes and control characters escaped.
std::string quoted(const std::string &text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      static const char digits[] = "0123456789abcdef";
      out += "\\u00";
      out += digits[(c >> 4) & 0xf];
      out += digits[c & 0xf];
    } else {
      out += c;
    }
  }
  return out + "\"";
}
} // namespace

void JsonObjectWriter::addKey(const std::string &key) {
  if (text.size() > 1)
    text += ',';
  text += quoted(key) + ':';
}

JsonObjectWriter &JsonObjectWriter::add(const std::string &key, int64_t value) {
  addKey(key);
  text += std::to_string(value);
  return *this;
}

JsonObjectWriter &JsonObjectWriter::add(const std::string &key, bool value) {
  addKey(key);
  text += value ? "true" : "false";
  return *this;
}

JsonObjectWriter &JsonObjectWriter::add(const std::string &key, const std::string &value) {
  addKey(key);
  text += quoted(value);
  return *this;
}

JsonObjectWriter &JsonObjectWriter::add(const std::string &key, const JsonObjectWriter &object) {
  addKey(key);
  text += object.str();
  return *this;
}
