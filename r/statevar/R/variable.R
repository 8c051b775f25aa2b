# Variables and arrays in R: creation, updates, and their R values.

#' Creates a variable from an R value, a JAX array or another variable (copied).
Variable <- function(initial_value, dtype = NULL, name = NULL, trainable = NULL, device = NULL) {
  value <- to_python(initial_value, what = "Variable's initial value")
  variable <- with_python_errors(statevar_module()$Variable(
    value, dtype = dtype, name = name, trainable = trainable, device = device
  ))
  as_statevar_object(variable, "variable")
}

#' The value as a JAX array (a variable's current value), of `dtype` if given.
as_jax <- function(x, dtype = NULL) {
  value <- to_python(x, what = "as_jax's value")
  as_statevar_object(with_python_errors(bridge()$as_array(value, dtype = dtype)), "array")
}

#' A placement scope for `with()`: variables created and arithmetic on variables run there.
device <- function(name) {
  scope <- with_python_errors(statevar_module()$device(name))
  class(scope) <- c("statevar_device_scope", class(scope))
  scope
}

# Enters the scope (where a device name is checked) with statevar's errors as R errors,
# evaluates `expr` in the caller's environment, and leaves the scope however it ends.
with.statevar_device_scope <- function(data, expr, ...) {
  with_python_errors(data$`__enter__`(), call = sys.call())
  tryCatch(force(expr), finally = data$`__exit__`(NULL, NULL, NULL))
}

#' Turns placement logging (on Python's "statevar" logger) on or off.
set_log_device_placement <- function(enabled) {
  invisible(with_python_errors(bridge()$set_log_device_placement(isTRUE(enabled))))
}

# The updates take R values; each returns the variable, as in Python.
update_methods <- c("assign", "assign_add", "assign_sub")

`$.statevar_array` <- function(x, name) {
  if (name %in% update_methods && inherits(x, python_variable_classes)) {
    method <- reticulate::py_get_attr(x, name)
    return(function(value, ...) {
      call <- sys.call()
      value <- to_python(value, what = sprintf("the value given to %s", name))
      result <- with_python_errors(reticulate::py_call(method, value, ...), call = call)
      as_statevar_object(result, "variable")
    })
  }
  # Not NextMethod(): this method is also registered for the Python classes further along
  # x's class vector.
  attribute <- with_python_errors(reticulate::py_get_attr(x, name), call = sys.call())
  if (!is_python(attribute)) {
    return(attribute)
  }
  if (inherits(attribute, python_scalar_classes)) {
    return(reticulate::py_to_r(attribute))
  }
  if (inherits(attribute, "numpy.dtype")) {
    return(reticulate::py_str(attribute))
  }
  as_statevar_object(attribute)
}

# Python values that read as R values: v$name, v$trainable (and v$dtype, as its name).
python_scalar_classes <- c(
  "python.builtin.bool", "python.builtin.int", "python.builtin.float", "python.builtin.str"
)

as.array.statevar_array <- function(x, ...) to_r(x)

as.vector.statevar_array <- function(x, mode = "any") as.vector(to_r(x), mode = mode)

as.double.statevar_array <- function(x, ...) as.double(to_r(x))

as.integer.statevar_array <- function(x, ...) as.integer(to_r(x))

as.logical.statevar_array <- function(x, ...) as.logical(to_r(x))

as.complex.statevar_array <- function(x, ...) as.complex(to_r(x))

dim.statevar_array <- function(x) {
  as.integer(unlist(reticulate::py_to_r(reticulate::py_get_attr(x, "shape"))))
}

length.statevar_array <- function(x) {
  as.integer(prod(dim.statevar_array(x)))
}

print.statevar_array <- function(x, ...) {
  cat(reticulate::py_to_r(bridge()$describe(x)), "\n", sep = "")
  if (reticulate::py_to_r(bridge()$is_concrete(x))) {
    print(to_r(x), ...)
  }
  invisible(x)
}

# Indexing reads R values, with R's indices (from 1, negative to drop, logical, matrix).
`[.statevar_array` <- function(x, ...) {
  to_r(x)[...]
}

# Assigning to elements of a variable, with R's indices, assigns the whole new value in
# place (`v$assign()`), with its dtype and shape checks: `v[1, 2] <- 5` keeps `v` the
# same variable.
`[<-.statevar_variable` <- function(x, ..., value) {
  call <- sys.call()
  updated <- to_r(x)
  updated[...] <- value
  variable <- as_statevar_object(x, "variable")
  with_python_errors(
    reticulate::py_call(reticulate::py_get_attr(variable, "assign"), to_numpy(updated)),
    call = call
  )
  variable
}
