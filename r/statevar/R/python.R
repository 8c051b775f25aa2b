# Finding Python, loading statevar and its R bridge, and turning Python's errors into R's.

.state <- new.env(parent = emptyenv())

.onLoad <- function(libname, pkgname) {
  python <- Sys.getenv("STATEVAR_PYTHON")
  if (nzchar(python) && !nzchar(Sys.getenv("RETICULATE_PYTHON"))) {
    reticulate::use_python(python, required = TRUE)
  }
  # Delay-loaded, so that reticulate, when told no Python, looks for one that has statevar.
  .state$statevar <- reticulate::import("statevar", convert = FALSE, delay_load = TRUE)
  register_python_classes()
}

# The Python module statevar (unconverted: every result stays a Python object).
statevar_module <- function() .state$statevar

# The package's Python half, inst/python/statevar_r.py, imported on first use.
bridge <- function() {
  if (is.null(.state$bridge)) {
    statevar_module()$Variable  # loads statevar first, so a missing statevar says so
    path <- system.file("python", package = "statevar", mustWork = TRUE)
    .state$bridge <- reticulate::import_from_path("statevar_r", path = path, convert = FALSE)
  }
  .state$bridge
}

# Evaluates `expr`, raising a Python exception as an R error of class
# c(<Python class name>, "statevar_error", "error", "condition") whose message is the
# exception's, e.g. "ShapeMismatchError: Cannot assign to Variable 'a': ...".
with_python_errors <- function(expr, call = sys.call(-1L)) {
  force(call)
  tryCatch(expr, error = function(e) {
    if (inherits(e, "statevar_error")) stop(e)
    parsed <- parse_python_error(conditionMessage(e))
    if (is.null(parsed)) stop(e)
    stop(errorCondition(
      paste0(parsed$type, ": ", parsed$message),
      class = c(parsed$type, "statevar_error"),
      call = call
    ))
  })
}

# Splits reticulate's message for a Python exception, "module.Type: message" (with a
# pointer to py_last_error() in newer reticulate), into the type's name and the message.
# Returns NULL for an error that did not come from Python.
parse_python_error <- function(text) {
  text <- sub("\n*Run `reticulate::py_last_error\\(\\)` for details\\.\n*$", "", text)
  # JAX's note on the traceback it filtered follows the message.
  text <- sub("\n-{10,}\nFor simplicity, JAX has removed its internal frames[\\s\\S]*$", "", text, perl = TRUE)
  text <- sub("\n+$", "", text)
  pattern <- "^(?:[A-Za-z_][A-Za-z0-9_]*\\.)*([A-Za-z_][A-Za-z0-9_]*(?:Error|Exception|Interrupt|Exit)): "
  match <- regmatches(text, regexec(pattern, text, perl = TRUE))[[1L]]
  if (length(match) == 0L) {
    return(NULL)
  }
  list(type = match[[2L]], message = substring(text, nchar(match[[1L]]) + 1L))
}

# Python classes that R methods are registered for, beside the package's own classes:
# reticulate names an object's classes after its Python class and that class's bases, and
# these names differ between JAX versions (jax 0.10: jax.jaxlib._jax.Array; 0.12:
# jax.Array). Values the package returns also carry its own classes, "statevar_variable"
# and "statevar_array", whatever JAX calls them.
python_variable_classes <- "statevar._cell.variable.Variable"
python_array_classes <- c(
  "jaxlib._jax.ArrayImpl",
  "jax.jaxlib._jax.Array",
  "jax.Array",
  "jaxlib.xla_extension.ArrayImpl",
  "jax._src.core.Tracer",
  "jax.core.Tracer"
)

array_methods <- function() {
  list(
    Ops = Ops.statevar_array,
    Math = Math.statevar_array,
    Summary = Summary.statevar_array,
    mean = mean.statevar_array,
    t = t.statevar_array,
    as.array = as.array.statevar_array,
    as.vector = as.vector.statevar_array,
    as.double = as.double.statevar_array,
    as.integer = as.integer.statevar_array,
    as.logical = as.logical.statevar_array,
    as.complex = as.complex.statevar_array,
    dim = dim.statevar_array,
    length = length.statevar_array,
    print = print.statevar_array,
    "$" = `$.statevar_array`,
    "[" = `[.statevar_array`
  )
}

register_python_classes <- function() {
  namespace <- environment(register_python_classes)
  methods <- array_methods()
  for (class in c(python_variable_classes, python_array_classes)) {
    for (generic in names(methods)) {
      registerS3method(generic, class, methods[[generic]], envir = namespace)
    }
  }
  for (class in python_variable_classes) {
    registerS3method("[<-", class, `[<-.statevar_variable`, envir = namespace)
  }
}
