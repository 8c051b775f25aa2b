"""Tracing: the frames that record what a trace reads and assigns, how nested
transformations are told apart, and the one module that reaches into JAX's internals."""
