"""Declares statevar's C extension; everything else is in pyproject.toml.

The eager updates' hot path and the update lock in C (statevar/_hotpath.c). Optional: where
it cannot be compiled, the install goes on and statevar runs the pure-Python updates and a
threading.RLock, which give the same results at about 1.3x a raw jitted call where the C
ones take about 1.15x (benchmarks/README.md).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("statevar._hotpath", ["statevar/_hotpath.c"], optional=True)])
