"""Compilation: the compiled step (`statevar.jit`), its cache of compiled forms, gradients,
stateless calls and the memory report of a step."""
