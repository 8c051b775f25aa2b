# Gradients of R functions with respect to variables.

#' Returns a function computing `f`'s value and its gradient with respect to `wrt`.
#'
#' `f` is an R function returning a scalar, reading variables by closure (as with
#' tf$GradientTape) or taking arguments. `wrt` is a variable or a (named) list of them.
#' The returned function takes `f`'s arguments and returns list(value =, grads =), where
#' `grads` mirrors `wrt`: an array per variable, NULL for one the value does not depend on
#' or that is not trainable.
value_and_grad <- function(f, wrt, has_aux = FALSE) {
  differentiated <- with_python_errors(statevar_module()$value_and_grad(
    python_function(f, has_aux), python_tree(wrt), has_aux = isTRUE(has_aux)
  ))
  function(...) {
    call <- sys.call()
    result <- call_differentiated(differentiated, list(...), call)
    list(value = result[[1L]], grads = in_order_of(result[[2L]], wrt))
  }
}

#' Returns a function computing the gradient of `f` with respect to `wrt`.
#'
#' As `value_and_grad`, returning only the gradients, shaped as `wrt`.
grad <- function(f, wrt) {
  differentiated <- with_python_errors(
    statevar_module()$grad(python_function(f, FALSE), python_tree(wrt))
  )
  function(...) {
    call <- sys.call()
    in_order_of(call_differentiated(differentiated, list(...), call), wrt)
  }
}

# Calls statevar's differentiated function. An R error raised by the R function being
# differentiated is raised again as itself, not as the Python error it passed through.
call_differentiated <- function(differentiated, args, call) {
  .state$callback_error <- NULL
  on.exit(.state$callback_error <- NULL)
  out <- tryCatch(
    do.call(reticulate::py_call, c(list(differentiated), lapply(args, to_python))),
    error = function(e) {
      if (!is.null(.state$callback_error)) stop(.state$callback_error)
      with_python_errors(stop(e), call = call)
    }
  )
  from_python(out)
}

# Gradients of a named list come back from a Python dict, in its sorted key order; R keeps
# the order of `wrt`'s names.
in_order_of <- function(grads, wrt) {
  if (is_python(wrt) || !is.list(grads)) {
    return(grads)
  }
  if (!is.null(names(wrt))) {
    grads <- grads[names(wrt)]
  }
  stats::setNames(Map(in_order_of, grads, wrt), names(grads))
}

# `wrt` for Python: a variable as it is, an unnamed list as a Python list, a named list as
# a dict.
python_tree <- function(wrt) {
  if (is_python(wrt)) {
    return(wrt)
  }
  if (!is.list(wrt)) {
    stop("statevar: wrt must be a Variable or a list of Variables; got ",
      paste(class(wrt), collapse = "/"), call. = FALSE)
  }
  reticulate::r_to_py(lapply(wrt, python_tree))
}

# An R function as a Python callable for statevar: its arguments arrive as Python objects
# marked with the package's classes, so R's operators on them run in JAX (on tracers while
# differentiating), and its result goes back as a Python value.
python_function <- function(f, has_aux) {
  force(f)
  reticulate::r_to_py(function(...) {
    args <- lapply(list(...), from_python)
    # An R error here is kept, so that the gradient's caller gets it back as it was.
    tryCatch(python_result(do.call(f, args), has_aux), error = function(e) {
      .state$callback_error <- e
      stop(e)
    })
  }, convert = FALSE)
}

python_result <- function(result, has_aux) {
  if (!isTRUE(has_aux)) {
    return(to_python(result))
  }
  if (!is.list(result) || length(result) != 2L) {
    stop("statevar: with has_aux = TRUE, the function must return list(value, aux)", call. = FALSE)
  }
  reticulate::tuple(to_python(result[[1L]]), python_aux(result[[2L]]))
}

python_aux <- function(aux) {
  if (is.list(aux)) reticulate::r_to_py(lapply(aux, python_aux)) else to_python(aux)
}
