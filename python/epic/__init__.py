"""epic: MLIR compiler and runtime for MoE dispatch/combine (DeepEP V2 compatible).

Kept import-light on purpose: submodules, torch and the compiled ``epic._C``
extension are loaded on first use, never at package import.
"""

import importlib

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "reference",
    "buffer",
    "autograd",
    "ElasticBuffer",
    "VirtualWorld",
    "EPHandle",
    "EventHandle",
    "EventOverlap",
    "topk_idx_t",
    "get_physical_domain_size",
    "get_logical_domain_size",
    "jit",
    "language",
]

_LAZY_SUBMODULES = frozenset({"reference", "buffer", "autograd", "language"})
# DeepEP's names, from epic.buffer (loaded on first use).
_FROM_BUFFER = frozenset({"ElasticBuffer", "VirtualWorld", "EPHandle", "EventHandle",
                          "EventOverlap", "topk_idx_t"})
# DeepEP's module-level domain functions.
_FROM_TOPOLOGY = frozenset({"get_physical_domain_size", "get_logical_domain_size"})


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module  # cache: later lookups bypass __getattr__
        return module
    if name == "jit":  # the decorator of epic.dsl.jit
        from .dsl.jit import jit as decorator

        globals()["jit"] = decorator
        return decorator
    if name in _FROM_TOPOLOGY:
        value = getattr(importlib.import_module("._topology", __name__), name)
        globals()[name] = value
        return value
    if name in _FROM_BUFFER:
        value = getattr(importlib.import_module(".buffer", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _LAZY_SUBMODULES | _FROM_BUFFER | _FROM_TOPOLOGY)
