"""The cell: `Variable`, the mutable holder of one `jax.Array`, with everything one variable
needs on its own: conversion of values, placement on devices, views and indexing, operators
and array methods, the update kernels and the copy policy, creation, and walking nested
structures of variables."""
