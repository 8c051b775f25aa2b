# R's operators and group generics on variables and arrays, computed by JAX.

Ops.statevar_array <- function(e1, e2) {
  op <- .Generic
  result <- if (missing(e2)) {
    with_python_errors(bridge()$unary(op, to_operand(e1)), call = sys.call(-1L))
  } else {
    with_python_errors(bridge()$binary(op, to_operand(e1), to_operand(e2)), call = sys.call(-1L))
  }
  as_statevar_object(result, "array")
}

Math.statevar_array <- function(x, ...) {
  name <- .Generic
  extra <- list(...)
  result <- if (name %in% c("cumsum", "cumprod")) {
    bridge()$cumulative(name, x)
  } else if (name == "round") {
    bridge()$round_to(x, if (length(extra)) extra[[1L]] else 0L)
  } else if (name == "log" && length(extra) > 0L) {
    return(log(x) / log(extra[[1L]]))
  } else {
    bridge()$math(name, x)
  }
  unsupported_if_none(result, name)
}

Summary.statevar_array <- function(..., na.rm = FALSE) {
  name <- .Generic
  values <- lapply(list(...), to_operand, scalar = FALSE)
  result <- with_python_errors(bridge()$summary(name, values), call = sys.call(-1L))
  unsupported_if_none(result, name)
}

mean.statevar_array <- function(x, ...) as_statevar_object(bridge()$mean(x), "array")

t.statevar_array <- function(x) as_statevar_object(bridge()$transpose(x), "array")

unsupported_if_none <- function(result, name) {
  if (inherits(result, "python.builtin.NoneType")) {
    stop(sprintf(
      "statevar: %s() is not supported on statevar variables and arrays; use as.array(x) first",
      name
    ), call. = FALSE)
  }
  as_statevar_object(result, "array")
}

#' Matrix product: JAX's for variables and arrays, base R's otherwise.
`%*%` <- function(x, y) {
  if (is_python(x) || is_python(y)) {
    result <- with_python_errors(bridge()$matmul(
      to_operand(x, scalar = FALSE), to_operand(y, scalar = FALSE)
    ))
    return(as_statevar_object(result, "array"))
  }
  base::`%*%`(x, y)
}
