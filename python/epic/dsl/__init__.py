"""The Triton-style DSL: ``@epic.jit`` kernels (:mod:`epic.dsl.jit`) written with
``epic.language``, and the CPU interpreter that runs them (:mod:`epic.dsl.interpreter`)."""
