# Moving values between R and Python without NumPy's C interface: R vectors cross as flat
# Python lists in R's column-major order, with their dim, and come back the same way.

is_python <- function(x) inherits(x, "python.builtin.object")

# An R vector, matrix or array as a NumPy array on the host, element for element: R's
# array(1:6, c(2, 3)) is the 2x3 array [[1, 3, 5], [2, 4, 6]]. A plain vector of length
# one becomes a 0-d array when `scalar` is TRUE (R has no scalars).
to_numpy <- function(x, scalar = TRUE, what = "value") {
  mode <- storage.mode(x)
  if (is.factor(x) || !mode %in% c("double", "integer", "logical", "complex")) {
    stop(sprintf(
      "statevar: %s must be a numeric, integer, logical or complex vector, matrix or array; got %s",
      what, paste(class(x), collapse = "/")
    ), call. = FALSE)
  }
  if (mode %in% c("integer", "logical") && anyNA(x)) {
    stop(sprintf(
      "statevar: %s holds NA, which %s values cannot hold in JAX (only doubles have NaN)",
      what, mode
    ), call. = FALSE)
  }
  shape <- dim(x)
  flat <- as.vector(x)
  # reticulate hands a length-one vector over as a scalar, longer ones as a list.
  with_python_errors(bridge()$from_r(
    flat, if (is.null(shape)) NULL else as.list(as.integer(shape)), mode, scalar
  ))
}

# An operand of an operator: Python objects pass as they are, a plain R number as a Python
# scalar (weakly typed, so `v + 1` keeps v's dtype), R vectors and arrays as host arrays.
to_operand <- function(x, scalar = TRUE) {
  if (is_python(x)) {
    return(x)
  }
  plain_number <- is.null(dim(x)) && length(x) == 1L && !is.factor(x) &&
    (is.double(x) || is.complex(x) || ((is.integer(x) || is.logical(x)) && !is.na(x)))
  if (scalar && plain_number) {
    return(reticulate::r_to_py(x))
  }
  to_numpy(x, scalar = FALSE, what = "an operand")
}

# A value for Python: a Python object as it is, an R vector or array as a host array.
to_python <- function(x, what = "value") {
  if (is_python(x)) x else to_numpy(x, what = what)
}

# Marks a Python object with the package's own class, so R's methods find it whatever
# JAX's classes are called: "statevar_variable" (and "statevar_array") for a Variable,
# "statevar_array" for an array or a tracer inside `grad`.
as_statevar_object <- function(x, kind = reticulate::py_to_r(bridge()$kind(x))) {
  own <- switch(kind,
    variable = c("statevar_variable", "statevar_array"),
    array = "statevar_array",
    character()
  )
  if (length(own) > 0L && !inherits(x, own[[1L]])) {
    class(x) <- unique(c(own, class(x)))
  }
  x
}

# A Python result as R sees it: a variable or array marked with the package's classes,
# a list or tuple as an R list, a dict as a named list, None as NULL.
from_python <- function(x) {
  kind <- reticulate::py_to_r(bridge()$kind(x))
  switch(kind,
    none = NULL,
    list = lapply(seq_len(reticulate::py_len(x)) - 1L, function(i) {
      from_python(reticulate::py_get_item(x, i))
    }),
    dict = {
      keys <- as.character(reticulate::py_to_r(bridge()$keys(x)))
      values <- lapply(keys, function(key) from_python(reticulate::py_get_item(x, key)))
      stats::setNames(values, keys)
    },
    as_statevar_object(x, kind)
  )
}

# The R value of a variable or an array: a vector or array of R's mode for its dtype, in
# R's layout. A 0-d value becomes a plain vector of length one.
to_r <- function(x) {
  parts <- with_python_errors(bridge()$to_r(x), call = sys.call(-1L))
  flat <- reticulate::py_to_r(reticulate::py_get_item(parts, 0L))
  shape <- as.integer(unlist(reticulate::py_to_r(reticulate::py_get_item(parts, 1L))))
  mode <- reticulate::py_to_r(reticulate::py_get_item(parts, 2L))
  values <- if (length(flat) == 0L) vector(mode, 0L) else unlist(flat, use.names = FALSE)
  storage.mode(values) <- mode
  if (length(shape) == 0L) values else array(values, dim = shape)
}
