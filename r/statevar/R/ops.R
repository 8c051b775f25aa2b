# R's operators and group generics on variables and arrays, computed by JAX.

Ops.statevar_array <- function(e1, e2) {
  # The call as written (`a * b`), for the error message.
  operands <- if (missing(e2)) list(substitute(e1)) else list(substitute(e1), substitute(e2))
  call <- as.call(c(as.name(.Generic), operands))
  result <- if (missing(e2)) {
    with_python_errors(bridge()$unary(.Generic, to_operand(e1)), call = call)
  } else {
    with_python_errors(bridge()$binary(.Generic, to_operand(e1), to_operand(e2)), call = call)
  }
  as_statevar_object(result, "array")
}

Math.statevar_array <- function(x, ...) {
  call <- sys.call()
  name <- .Generic
  extra <- list(...)
  if (name == "log" && length(extra) > 0L) {
    return(log(x) / log(extra[[1L]]))
  }
  result <- with_python_errors(call = call, if (name %in% c("cumsum", "cumprod")) {
    bridge()$cumulative(name, x)
  } else if (name == "round") {
    bridge()$round_to(x, if (length(extra)) extra[[1L]] else 0L)
  } else {
    bridge()$math(name, x)
  })
  unsupported_if_none(result, name)
}

Summary.statevar_array <- function(..., na.rm = FALSE) {
  call <- sys.call()
  values <- lapply(list(...), to_operand, scalar = FALSE)
  result <- with_python_errors(bridge()$summary(.Generic, values), call = call)
  unsupported_if_none(result, .Generic)
}

mean.statevar_array <- function(x, ...) {
  as_statevar_object(with_python_errors(bridge()$mean(x)), "array")
}

t.statevar_array <- function(x) {
  as_statevar_object(with_python_errors(bridge()$transpose(x)), "array")
}

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
