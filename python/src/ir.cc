//===- ir.cc - epic._ir: building MLIR from Python (the DSL's front end) ---===//
//
// The @epic.jit code generator (python/epic/dsl/codegen.py) builds its kernels
// through this module, the way Triton's python/src/ir.cc serves its AST
// visitor: a context with epic's and the upstream dialects, a module, and a
// builder that creates any registered operation from its name, operands,
// result types and attributes (types and attributes in MLIR's syntax), with
// the Python source location of the statement that made it. Every op is
// verified as the module is; errors carry those locations. Only where the
// compiler is built (it links MLIR); the runtime-only GPU build skips it.
//
//===----------------------------------------------------------------------===//

#include "epic/Compiler.h"
#include "epic/Conversion/LaunchAttributes.h"
#include "epic/InitAllDialects.h"

#include "mlir/AsmParser/AsmParser.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

namespace py = pybind11;
using namespace mlir;

namespace {

/// What every handle keeps alive: the context and the diagnostics it collects.
struct Session {
  Session() : context(makeRegistry()) {
    context.loadAllAvailableDialects();
    context.printOpOnDiagnostic(false);
    handler = std::make_unique<ScopedDiagnosticHandler>(&context, [this](Diagnostic &d) {
      std::string where;
      llvm::raw_string_ostream os(where);
      d.getLocation().print(os);
      messages += where + ": " + d.str() + "\n";
      return success();
    });
  }
  static DialectRegistry makeRegistry() {
    DialectRegistry registry;
    epic::registerAllDialects(registry);
    return registry;
  }
  /// The collected diagnostics, cleared.
  std::string take() {
    std::string out;
    std::swap(out, messages);
    return out;
  }
  MLIRContext context;
  std::string messages;
  std::unique_ptr<ScopedDiagnosticHandler> handler;
};

using SessionPtr = std::shared_ptr<Session>;

[[noreturn]] void fail(Session &s, const std::string &what) {
  std::string details = s.take();
  throw std::invalid_argument(what + (details.empty() ? "" : ":\n" + details));
}

Type parseTypeOrThrow(Session &s, const std::string &text) {
  Type type = parseType(text, &s.context);
  if (!type)
    fail(s, "not an MLIR type: " + text);
  return type;
}

struct ValueHandle {
  SessionPtr session;
  Value value;
  std::string type() const {
    std::string text;
    llvm::raw_string_ostream os(text);
    value.getType().print(os);
    return text;
  }
};

struct BlockHandle {
  SessionPtr session;
  Block *block;
};

struct OpHandle {
  SessionPtr session;
  Operation *op;
};

struct ModuleHandle {
  SessionPtr session;
  OwningOpRef<ModuleOp> module;
};

class BuilderHandle {
public:
  explicit BuilderHandle(SessionPtr s) : session(std::move(s)), builder(&session->context) {}

  void setLocation(const std::string &file, unsigned line, unsigned column) {
    location = FileLineColLoc::get(&session->context, file, line, column);
  }
  void setInsertionPointToEnd(const BlockHandle &block) {
    builder.setInsertionPointToEnd(block.block);
  }
  void setInsertionPointBefore(const OpHandle &op) { builder.setInsertionPoint(op.op); }

  OpHandle create(const std::string &name, const std::vector<ValueHandle> &operands,
                  const std::vector<std::string> &resultTypes,
                  const std::map<std::string, std::string> &attributes, unsigned regions) {
    Session &s = *session;
    OperationState state(location ? *location : UnknownLoc::get(&s.context), name);
    if (!state.name.isRegistered())
      fail(s, "unknown operation '" + name + "'");
    for (const ValueHandle &v : operands)
      state.operands.push_back(v.value);
    for (const std::string &t : resultTypes)
      state.types.push_back(parseTypeOrThrow(s, t));
    for (const auto &[key, text] : attributes) {
      Attribute attr = parseAttribute(text, &s.context);
      if (!attr)
        fail(s, "not an MLIR attribute (for '" + key + "' of " + name + "): " + text);
      state.addAttribute(key, attr);
    }
    for (unsigned i = 0; i < regions; ++i)
      state.addRegion();
    Operation *op = builder.create(state);
    return {session, op};
  }

private:
  SessionPtr session;
  OpBuilder builder;
  std::optional<Location> location;
};

/// Launch metadata from a Python dict keyed by LaunchMetadata.def's names
/// (every key one of them, each value of its kind); a key it does not name
/// is a ValueError naming it.
epic::LaunchMetadata launchMetadataFrom(const py::dict &fields) {
  epic::LaunchMetadata md;
  for (const auto &[k, v] : fields) {
    std::string key = py::cast<std::string>(k);
    bool known = false;
#define EP_LAUNCH_KIND_Int int64_t
#define EP_LAUNCH_KIND_Flag bool
#define EP_LAUNCH_KIND_String std::string
#define EP_LAUNCH_KIND_Strings std::vector<std::string>
#define EP_LAUNCH_KIND_Ints std::vector<int64_t>
#define EP_LAUNCH_FIELD(member, name, Kind, required, absent)                                      \
  EP_LAUNCH_FROM_##Kind(member, name, Kind)
#define EP_LAUNCH_FROM_ONE(member, name, Kind)                                                     \
  if (key == name) {                                                                               \
    md.member = py::cast<EP_LAUNCH_KIND_##Kind>(v);                                                \
    known = true;                                                                                  \
  }
#define EP_LAUNCH_FROM_Int EP_LAUNCH_FROM_ONE
#define EP_LAUNCH_FROM_Flag EP_LAUNCH_FROM_ONE
#define EP_LAUNCH_FROM_String EP_LAUNCH_FROM_ONE
#define EP_LAUNCH_FROM_Strings EP_LAUNCH_FROM_ONE
#define EP_LAUNCH_FROM_Ints EP_LAUNCH_FROM_ONE
// The config and TMA descriptors are convert-ep-to-comm's, not the DSL's.
#define EP_LAUNCH_FROM_Text(member, name, Kind)
#define EP_LAUNCH_FROM_Maps(member, name, Kind)
#include "epic/runtime/LaunchMetadata.def"
    if (!known)
      throw py::value_error("'" + key + "' is not a launch field the DSL sets");
  }
  return md;
}

} // namespace


PYBIND11_MODULE(_ir, m) {
  m.doc() = "MLIR from Python for epic's DSL (python/epic/dsl/codegen.py)";

  py::class_<Session, SessionPtr>(m, "Context").def(py::init<>());

  py::class_<ValueHandle>(m, "Value")
      .def_property_readonly("type", &ValueHandle::type);

  py::class_<BlockHandle>(m, "Block")
      .def("arg", [](const BlockHandle &b, unsigned i) {
        if (i >= b.block->getNumArguments())
          throw std::out_of_range("block argument " + std::to_string(i));
        return ValueHandle{b.session, b.block->getArgument(i)};
      })
      .def_property_readonly("num_args", [](const BlockHandle &b) {
        return b.block->getNumArguments();
      });

  py::class_<OpHandle>(m, "Operation")
      .def("result", [](const OpHandle &o, unsigned i) {
        if (i >= o.op->getNumResults())
          throw std::out_of_range("result " + std::to_string(i) + " of " +
                                  o.op->getName().getStringRef().str());
        return ValueHandle{o.session, o.op->getResult(i)};
      })
      .def_property_readonly("num_results", [](const OpHandle &o) { return o.op->getNumResults(); })
      .def("add_block", [](const OpHandle &o, unsigned region, const std::vector<std::string> &args) {
        if (region >= o.op->getNumRegions())
          throw std::out_of_range("region " + std::to_string(region));
        Block *block = new Block();
        o.op->getRegion(region).push_back(block);
        for (const std::string &t : args)
          block->addArgument(parseTypeOrThrow(*o.session, t), o.op->getLoc());
        return BlockHandle{o.session, block};
      }, py::arg("region"), py::arg("arg_types") = std::vector<std::string>{})
      .def("block", [](const OpHandle &o, unsigned region) {
        if (region >= o.op->getNumRegions() || o.op->getRegion(region).empty())
          throw std::out_of_range("region " + std::to_string(region) + " has no block");
        return BlockHandle{o.session, &o.op->getRegion(region).front()};
      })
      .def("set_launch_metadata", [](const OpHandle &o, const py::dict &fields) {
        epic::setLaunchAttributes(o.op, launchMetadataFrom(fields));
      }, py::arg("fields"))
      .def("erase", [](const OpHandle &o) { o.op->erase(); });

  py::class_<ModuleHandle>(m, "Module")
      .def(py::init([](SessionPtr s) {
        auto handle = std::make_unique<ModuleHandle>();
        handle->session = s;
        handle->module = ModuleOp::create(UnknownLoc::get(&s->context));
        return handle;
      }))
      .def_property_readonly("body", [](ModuleHandle &m) {
        return BlockHandle{m.session, m.module->getBody()};
      })
      .def("set_attr", [](ModuleHandle &m, const std::string &key, const std::string &text) {
        Attribute attr = parseAttribute(text, &m.session->context);
        if (!attr)
          fail(*m.session, "not an MLIR attribute: " + text);
        (*m.module)->setAttr(key, attr);
      })
      .def("verify", [](ModuleHandle &m) {
        if (failed(mlir::verify(*m.module)))
          fail(*m.session, "the generated IR does not verify");
      })
      .def("__str__", [](ModuleHandle &m) {
        std::string text;
        llvm::raw_string_ostream os(text);
        m.module->print(os);
        return text;
      });

  py::class_<BuilderHandle>(m, "Builder")
      .def(py::init<SessionPtr>())
      .def("set_location", &BuilderHandle::setLocation)
      .def("set_insertion_point_to_end", &BuilderHandle::setInsertionPointToEnd)
      .def("set_insertion_point_before", &BuilderHandle::setInsertionPointBefore)
      .def("create", &BuilderHandle::create, py::arg("name"),
           py::arg("operands") = std::vector<ValueHandle>{},
           py::arg("result_types") = std::vector<std::string>{},
           py::arg("attributes") = std::map<std::string, std::string>{}, py::arg("regions") = 0);

  m.def("compile", [](const std::string &source, const std::string &backend, bool cubin) {
    epic::CompileOptions options;
    options.backend = backend;
    options.emitCubin = cubin;
    epic::CompileResult r;
    try {
      r = epic::compileModule(source, options, "<dsl>");
    } catch (const epic::CompileError &e) {
      throw std::invalid_argument(e.what());
    }
    py::dict out;
    out["ptx"] = r.ptx;
    out["cubin"] = py::bytes(r.cubin);
    out["metadata"] = r.metadataJson();
    out["ptxas"] = r.ptxasLog;
    return out;
  }, py::arg("source"), py::arg("backend") = "virtual", py::arg("cubin") = true,
     "epic-to-ptx on MLIR text: PTX, cubin and metadata (raises with the diagnostics).");
}
