"""``@epic.jit``: kernels written in Python with ``epic.language``, launched Triton-style.

    import epic
    import epic.language as el

    @epic.jit
    def scale(x_ptr, y_ptr, n, factor, BLOCK: el.constexpr):
        offsets = el.program_id(0) * BLOCK + el.arange(0, BLOCK)
        mask = offsets < n
        el.store(y_ptr + offsets, el.load(x_ptr + offsets, mask=mask) * factor, mask=mask)

    scale[(num_blocks,)](x, y, n, 2.0, BLOCK=256, world=epic.VirtualWorld(4))

A launch runs the grid on every rank of the world. An argument given as a list with one entry per
rank is per-rank; a :class:`SymmetricMemory` is every rank's window (``el.peer_ptr`` reaches the
others); everything else is passed to every rank. A kernel may call another ``@epic.jit``
function (``copy_row(dst, src, H, BH)``): the compiler inlines it, the interpreter runs it in
place. ``EPIC_INTERPRET=1`` runs kernels on the CPU (:mod:`epic.dsl.interpreter`).
``kernel.compile(*args, **constexprs)`` translates a kernel (:mod:`epic.dsl.codegen`, through
``epic._ir``) into comm + upstream IR, PTX and a cubin (``.asm["ir" | "ptx" | "cubin"]``);
launching compiled kernels on a GPU is the next step and a launch without ``EPIC_INTERPRET``
says so.
"""

from __future__ import annotations

import functools
import inspect
import json
import os

import numpy as np

from . import dispatch
from .errors import CallError, KernelError
from .interpreter import SymmetricMemory

__all__ = ["jit", "JITFunction", "SymmetricMemory", "KernelError", "interpreting"]


def interpreting() -> bool:
    return os.environ.get("EPIC_INTERPRET", "") not in ("", "0")


class JITFunction:
    """A kernel: ``kernel[grid](*args, world=..., **constexprs)``."""

    __epic_jit_function__ = True  # (dispatch.JIT_FUNCTION: what the checks and codegen look for)

    def __init__(self, fn):
        self.fn = fn
        self.signature = inspect.signature(fn)
        self.constexprs = {name for name, p in self.signature.parameters.items()
                           if dispatch.is_constexpr(p.annotation)}
        self.cache = {}  # compiled kernels by specialization
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid):
        return functools.partial(self.run, grid)

    @property
    def prepare(self):
        """``kernel.prepare[grid](*args, buffer=...)``: everything of a launch but the launch
        (compiled, arguments checked, parameter records on the device), as a
        :class:`PreparedLaunch`; calling it queues the kernel with no host work, so it can be
        captured in a CUDA graph and replayed. In the interpreter, calling it runs the kernel."""
        return _Preparer(self)

    def __call__(self, *args, **kwargs):
        """Inside a kernel, a call of another @epic.jit function: the compiler inlines it, the
        interpreter runs it with the calling program's context. Outside, launch with a grid."""
        from . import interpreter

        context = dispatch.interpreted_program()
        if context is None:
            raise TypeError(f"{self.fn.__name__} is an @epic.jit kernel: launch it as "
                            f"{self.fn.__name__}[grid](...)")
        import sys

        caller = sys._getframe(1)
        return interpreter.call(context, self, args, kwargs,
                                f"{caller.f_code.co_filename}:{caller.f_lineno}")

    def bind_call(self, args, kwargs, callers, is_constant):
        """A kernel's call of this function: its arguments bound to its parameters (defaults
        applied), under the rules the compiler and the interpreter share: no recursion
        (`callers`: the functions the call is made in, outermost first) and a constant
        (`is_constant`) for every el.constexpr parameter. Raises :class:`CallError`."""
        name = self.fn.__name__
        if self.fn in callers:
            chain = " -> ".join(getattr(f, "__name__", "?") for f in list(callers) + [self.fn])
            raise CallError(f"recursive call of {name} ({chain}): calls of @epic.jit functions "
                            "are inlined, so a function cannot call itself")
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise CallError(f"{name}({', '.join(self.signature.parameters)}): {e}") from None
        bound.apply_defaults()
        for parameter in self.constexprs:
            if not is_constant(bound.arguments[parameter]):
                raise CallError(f"{name}: {parameter} is an el.constexpr, it takes a constant (a "
                                "literal, a constexpr or an el.static_range variable)")
        return bound

    def dependencies(self):
        """The @epic.jit functions this one calls, directly or not (their sources are part of
        the compiled code's identity), by the names its body uses (checks.called)."""
        from . import checks

        found, pending = [], [self]
        while pending:
            function = pending.pop()
            try:
                tree = checks.parse(function.fn)[0]
            except (checks.CompileError, SyntaxError):
                continue
            for value in checks.called(function.fn, tree):
                if value is not self and value not in found:
                    found.append(value)
                    pending.append(value)
        return found

    def specialization_key(self, bound):
        """What the compiled code depends on: every tensor's dtype and 16-byte alignment, every
        constexpr's value, and whether an integer is 1 or a multiple of 16 (Triton's
        specialization; per-rank lists specialize on what holds on every rank)."""
        key = []
        for name, value in bound.arguments.items():
            if name in self.constexprs:
                key.append((name, "constexpr", value))
            elif isinstance(value, SymmetricMemory) or _is_buffer(value):
                key.append((name, "window"))
            elif isinstance(value, list):
                keys = [self._value_key(v) for v in value] or [None]
                if any(k[:2] != keys[0][:2] for k in keys):
                    raise TypeError(f"{self.fn.__name__}: argument {name} has entries of "
                                    f"different kinds across ranks ({keys[0][:2]}, ...)")
                merged = keys[0][:2] + tuple(all(k[i] for k in keys)
                                             for i in range(2, len(keys[0])))
                key.append((name, "per-rank", merged))
            else:
                key.append((name, self._value_key(value)))
        return tuple(key)

    @staticmethod
    def _value_key(value):
        if hasattr(value, "dtype") and hasattr(value, "shape"):
            from .semantic_core import mlir_type

            numpy = isinstance(value, np.ndarray)
            address = value.ctypes.data if numpy else value.data_ptr()
            dtype = mlir_type(value.dtype if numpy else _torch_to_numpy(value.dtype))
            return ("tensor", dtype, address % 16 == 0)
        if isinstance(value, bool):
            return ("bool", "i1")
        if isinstance(value, int):
            return ("int", "i32" if -2**31 <= value < 2**31 else "i64", value == 1,
                    value % 16 == 0)
        if isinstance(value, float):
            return ("float", "f32")
        raise TypeError(f"unsupported kernel argument of type {type(value).__name__}")

    def argument_kinds(self, bound):
        """What each non-constexpr argument is in the kernel's signature."""
        kinds = []
        for (name, *key) in self.specialization_key(bound):
            if key[0] == "constexpr":
                continue
            value = key[-1] if key[0] == "per-rank" else key[0]
            if value == "window":
                kinds.append((name, ("window",)))
            elif value[0] == "tensor":  # (pointer, element type, 16-byte aligned)
                kinds.append((name, ("pointer", value[1], value[2])))
            elif value[0] == "int":  # (scalar, type, a multiple of 16)
                kinds.append((name, ("scalar", value[1], value[3])))
            else:
                kinds.append((name, ("scalar", value[1], False)))
        return kinds

    def compile(self, *args, num_warps=4, backend="virtual", abi="direct", ranks=1, **kwargs):
        """Compiles the kernel for these arguments' specialization (no GPU needed): a
        :class:`CompiledKernel` whose ``asm`` holds the IR, the PTX and the cubin. With
        ``abi="runtime"``, ``ranks`` is the world size of the buffers it runs on (its by-value
        parameter table holds a record per rank on the virtual backend). What `backend` cannot
        serve (el.put and el.flush on nccl: no GIN there) is refused first
        (:func:`epic.dsl.checks.check_backend`), a :class:`~epic.dsl.checks.SourceError`.

        The IR is also kept on disk (``$EPIC_CACHE_DIR/dsl``, keyed by the kernel's source, the
        specialization and the code generator), and with ``abi="runtime"`` its kernels go into
        the runtime's kernel cache: a GPU machine without the compiler (no ``epic._ir``) finds
        both there."""
        from . import checks

        # Before the caches: a program refused for this backend stays refused where its IR
        # was compiled before (or elsewhere, into the disk cache).
        checks.check_backend(self.fn, backend)
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        key = (self.specialization_key(bound), num_warps, backend, abi,
               ranks if abi == "runtime" else 1)
        if key in self.cache:
            return self.cache[key]
        path = self._disk_path(key)
        try:
            from epic import _ir
        except ImportError:
            _ir = None
        if _ir is None:
            if not os.path.exists(path):
                raise RuntimeError(
                    f"{self.fn.__name__}: this specialization is not in the DSL cache ({path}) "
                    "and the compiler (epic._ir, built where LLVM/MLIR are) is not here: compile "
                    "it there with the same EPIC_CACHE_DIR (kernel.compile(...))")
            with open(path) as f:
                compiled = CompiledKernel(self.fn.__name__, json.load(f)["ir"], None, num_warps)
        else:
            from .codegen import generate

            constexprs = {n: bound.arguments[n] for n in self.constexprs}
            ir_text = generate(_ir, self.fn, self.argument_kinds(bound), constexprs, num_warps,
                               abi=abi, ranks=ranks, backend=backend)
            if abi == "runtime":
                # One compile per specialization: the runtime finds the kernels by the IR's key
                # in its kernel cache, so they are compiled here (or taken from there: an
                # earlier process compiled them) and put there, not compiled again by
                # epic-compile (the same compiler and options) when a launch asks for them.
                from epic import _C

                runtime = _C.Runtime(backend, "", "")
                module = runtime.cached_kernels(ir_text)
                if module is None:
                    module = _ir.compile(ir_text, backend, True)
                    runtime.store_kernels(ir_text, module["ptx"], module["cubin"],
                                          module["metadata"])
            else:
                module = _ir.compile(ir_text, backend, True)
            compiled = CompiledKernel(self.fn.__name__, ir_text, module, num_warps)
            _write_atomically(path, json.dumps({"ir": ir_text}))
        self.cache[key] = compiled
        return compiled

    def _disk_path(self, key):
        import hashlib

        from . import checks, codegen, semantic, semantic_core

        digest = hashlib.sha256()
        called = [inspect.getsource(f.fn) for f in self.dependencies()]
        generator = [inspect.getsource(m) for m in (codegen, semantic, semantic_core, checks)]
        for part in [inspect.getsource(self.fn), repr(key)] + generator + called:
            digest.update(part.encode())
            digest.update(b"\0")
        root = os.environ.get("EPIC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                  "epic")
        return os.path.join(root, "dsl", f"{self.fn.__name__}-{digest.hexdigest()[:32]}.json")

    def run(self, grid, *args, world=None, num_warps=4, buffer=None, **kwargs):
        from epic.buffer import VirtualWorld

        buffers = [v for v in list(args) + list(kwargs.values()) if _is_buffer(v)]
        if buffer is not None and not _is_buffer(buffer):
            raise TypeError(f"{self.fn.__name__}: buffer must be an epic.ElasticBuffer, got "
                            f"{type(buffer).__name__}")
        if not interpreting() and (buffers or buffer is not None):
            prepared = self.prepare_launch(grid, buffer if buffer is not None else buffers[0],
                                           args, kwargs, num_warps)
            prepared()  # the records travel with the launch: nothing to keep alive
            return prepared.compiled
        if not isinstance(world, VirtualWorld):
            raise TypeError(f"{self.fn.__name__}[grid](...): pass world=epic.VirtualWorld(R) "
                            "(interpreter), or buffer=epic.ElasticBuffer (GPU; it is also the "
                            "window of kernels that take one)")
        grid = grid(kwargs) if callable(grid) else grid
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        if not 1 <= len(grid) <= 3 or any(not isinstance(g, int) or g < 1 for g in grid):
            raise ValueError(f"grid: 1 to 3 positive ints, got {grid}")
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.fn.__name__}: {e}") from None
        bound.apply_defaults()
        for name in self.constexprs:
            value = bound.arguments[name]
            if not isinstance(value, (int, float, bool, str, type(None))):
                raise TypeError(f"{self.fn.__name__}: constexpr {name} must be a Python constant, "
                                f"got {type(value).__name__}")
        R = world.num_ranks
        for name, value in bound.arguments.items():
            if isinstance(value, list) and len(value) != R:
                raise ValueError(f"{self.fn.__name__}: argument {name} has {len(value)} entries "
                                 f"for {R} ranks")
            if isinstance(value, SymmetricMemory) and value.num_ranks != R:
                raise ValueError(f"{self.fn.__name__}: window {name} has {value.num_ranks} ranks, "
                                 f"the world {R}")
        self.specialization_key(bound)  # rejects unsupported arguments before running
        if not interpreting():
            raise TypeError(
                f"{self.fn.__name__}: on a GPU a kernel runs on an epic.ElasticBuffer: pass "
                "buffer=... (EPIC_INTERPRET=1 runs kernels on the CPU instead)")
        if os.environ.get("EPIC_DSL_PRECOMPILE", "") not in ("", "0"):
            # Also compile what a GPU launch with these arguments needs (runtime ABI, virtual
            # world), so a machine without the compiler finds it in the caches.
            self.compile(*args, num_warps=num_warps, backend="virtual", abi="runtime", ranks=R,
                         **kwargs)
        from . import interpreter

        per_rank = []
        for r in range(R):
            values = []
            for name, value in bound.arguments.items():
                if isinstance(value, list):
                    value = value[r]
                if isinstance(value, SymmetricMemory):
                    value = interpreter.Pointer(value.ranks[r], 0, np.uint8, value, r)
                elif isinstance(value, np.ndarray):
                    value = interpreter.pointer_to(value)
                values.append(value)
            per_rank.append(values)
        interpreter.launch(self.fn, grid, per_rank, R)

    def prepare_launch(self, grid, buffer, args, kwargs, num_warps):
        """Compiled: the kernel on `buffer`'s GPU(s), every rank it serves, ready to queue. The
        buffer is the kernel's window; per-rank arguments are lists (virtual world)."""
        import struct

        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        if len(grid) != 1 or not isinstance(grid[0], int) or grid[0] < 1:
            raise ValueError(f"grid: compiled kernels take a 1-D grid of positive size, got {grid}")
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        ranks = buffer.num_ranks if buffer.virtual else 1
        compiled = self.compile(*args, num_warps=num_warps,
                                backend="virtual" if buffer.virtual else "nccl", abi="runtime",
                                ranks=buffer.num_ranks, **kwargs)
        state = buffer._runtime()  # the GPU side exists from here
        records = [{} for _ in range(ranks)]
        for name, value in bound.arguments.items():
            if name in self.constexprs or _is_buffer(value):
                continue
            values = value if isinstance(value, list) else [value] * ranks
            if len(values) != ranks:
                raise ValueError(f"{self.fn.__name__}: argument {name} has {len(values)} entries "
                                 f"for {ranks} ranks")
            for r, v in enumerate(values):
                if hasattr(v, "data_ptr"):
                    if not v.is_cuda:
                        raise ValueError(f"{self.fn.__name__}: argument {name} must be a CUDA "
                                         "tensor")
                    records[r][name] = v.data_ptr()
                elif isinstance(v, float):
                    records[r][name] = struct.unpack("<I", struct.pack("<f", v))[0]
                elif isinstance(v, (bool, int)):
                    records[r][name] = int(v) & (2**64 - 1)
                else:
                    raise TypeError(f"{self.fn.__name__}: argument {name}: a tensor, an int or "
                                    f"a float, got {type(v).__name__}")
        return PreparedLaunch(compiled, buffer, state.prepare_entry(compiled.asm["ir"], records,
                                                                    grid[0]))


class PreparedLaunch:
    """A launch of a compiled kernel on an ElasticBuffer with its parameter records checked and
    laid out: ``prepared(stream=None)`` queues it on `stream` (default: torch's current), the
    records travelling by value with the launch (graph-capturable; replays reuse the same
    arguments)."""

    def __init__(self, compiled, buffer, prepared=None, interpret=None):
        self.compiled, self.buffer, self._prepared, self._interpret = compiled, buffer, \
            prepared, interpret

    def __call__(self, stream=None):
        if self._interpret is not None:
            return self._interpret()
        import torch

        stream = stream if stream is not None else torch.cuda.current_stream()
        self.buffer._runtime().launch(self._prepared, getattr(stream, "cuda_stream", stream))
        return None


class _Preparer:
    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def prepare(*args, world=None, num_warps=4, buffer=None, **kwargs):
            kernel = self.kernel
            if buffer is not None and not _is_buffer(buffer):
                raise TypeError(f"{kernel.fn.__name__}: buffer must be an epic.ElasticBuffer, "
                                f"got {type(buffer).__name__}")
            if not interpreting():
                if buffer is None:
                    raise TypeError(f"{kernel.fn.__name__}.prepare[grid](...): pass buffer="
                                    "epic.ElasticBuffer (EPIC_INTERPRET=1 runs on the CPU)")
                return kernel.prepare_launch(grid, buffer, args, kwargs, num_warps)
            return PreparedLaunch(None, buffer, interpret=functools.partial(
                kernel.run, grid, *args, world=world, num_warps=num_warps, **kwargs))
        return prepare

class CompiledKernel:
    """A compiled @epic.jit kernel: ``asm["ir"]`` (comm + upstream MLIR), ``asm["ptx"]``,
    ``asm["cubin"]``, and the compiler's metadata (registers, shared memory, spills)."""

    def __init__(self, name, ir_text, compiled, num_warps):
        self.name, self.num_warps = name, num_warps
        self.asm = {"ir": ir_text}
        self.metadata = {}
        if compiled is not None:  # None: the IR came from the disk cache (no compiler here)
            self.asm.update(ptx=compiled["ptx"], cubin=compiled["cubin"])
            self.metadata = json.loads(compiled["metadata"])


def _write_atomically(path, text):
    """Written whole or not at all (a temporary file renamed), so processes can share it."""
    import tempfile

    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(temporary, path)


def _is_buffer(value):
    from epic.buffer import ElasticBuffer

    return isinstance(value, ElasticBuffer)


def _torch_to_numpy(dtype):
    import ml_dtypes

    name = str(dtype).replace("torch.", "")
    return np.dtype({"bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn}
                    .get(name, name))


def jit(fn=None, **options):
    """Makes `fn` an epic kernel (see the module docstring)."""
    if fn is None:
        return lambda f: JITFunction(f)
    return JITFunction(fn)
