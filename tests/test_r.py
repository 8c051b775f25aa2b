"""The R package in ``r/statevar`` and the R page of the docs, ``docs/r.md``, run with Rscript.

The package is installed once into a temporary library; R runs it against this Python
(``sys.executable``, with this checkout's statevar first on ``PYTHONPATH``). Starting R and
JAX takes seconds, so the page runs in one R session (its blocks in order, as a notebook)
and the package's behaviours run as named cases of one more session, each case checked by
its own test. Everything here is skipped, with the reason, where Rscript or reticulate is
missing (``apt-get install r-base-core r-cran-reticulate``; ``.ci/run`` installs them).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import jax
import pytest
from test_docs import read_blocks

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "r" / "statevar"
PAGE = ROOT / "docs" / "r.md"
CHUNK_MARKER = "@@statevar-chunk@@"
CASE_MARKER = "@@statevar-case "


def _missing_r() -> str | None:
    """Why the R tests cannot run here, or None when they can."""
    if shutil.which("Rscript") is None or shutil.which("R") is None:
        return "Rscript is not installed (apt-get install r-base-core r-cran-reticulate)"
    probe = subprocess.run(
        ["Rscript", "-e", "quit(status = !requireNamespace('reticulate', quietly = TRUE))"],
        capture_output=True,
        timeout=120,
    )
    if probe.returncode != 0:
        return "the R package reticulate is not installed (apt-get install r-cran-reticulate)"
    return _reticulate_refuses_this_python()


def _reticulate_refuses_this_python() -> str | None:
    """Why the installed reticulate cannot start this Python, when the reason is known:
    reticulate before 1.29 (Debian 12 ships 1.28) reads a Python's configuration with a
    script importing ``imp``, which Python 3.12 removed. Any other failure is left to the
    tests, which then fail."""
    script = subprocess.run(
        ["Rscript", "-e", "cat(system.file('config', 'config.py', package = 'reticulate'))"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    if not script:
        return None
    config = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    if config.returncode != 0 and "No module named 'imp'" in config.stderr:
        return (
            f"this reticulate cannot start Python {sys.version.split()[0]} (its config.py "
            "imports imp, removed in Python 3.12): the R tests run on Python 3.11"
        )
    return None


@pytest.fixture(scope="module")
def r_library(tmp_path_factory) -> pathlib.Path:
    """A temporary R library with the package installed by ``R CMD INSTALL``."""
    reason = _missing_r()
    if reason is not None:
        pytest.skip(reason)
    library = tmp_path_factory.mktemp("r-library")
    install = subprocess.run(
        ["R", "CMD", "INSTALL", "-l", str(library), str(PACKAGE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return library


def _environment(library: pathlib.Path, **overrides: str | None) -> dict[str, str]:
    environment = dict(os.environ)
    environment.update(
        RETICULATE_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        R_LIBS=str(library),
        LC_ALL="C.UTF-8",
    )
    environment.pop("STATEVAR_PYTHON", None)
    for name, value in overrides.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    return environment


def run_r(
    library: pathlib.Path, directory: pathlib.Path, code: str, **environment: str | None
) -> subprocess.CompletedProcess:
    """Runs an R script with the package's library and this Python; messages (and the
    errors `try` prints) go to standard output, in order with the rest."""
    script = directory / "script.R"
    script.write_text('sink(stdout(), type = "message")\n' + code, encoding="utf-8")
    return subprocess.run(
        ["Rscript", str(script)],
        cwd=directory,
        env=_environment(library, **environment),
        capture_output=True,
        text=True,
        timeout=600,
    )


def _normalize(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def test_r_page_runs_block_by_block(r_library, tmp_path):
    blocks = read_blocks(PAGE.read_text(encoding="utf-8"), "r")
    assert len(blocks) >= 15
    script = "".join(f'cat("{CHUNK_MARKER}\\n")\n{block.source}' for block in blocks)
    result = run_r(r_library, tmp_path, script)
    printed = result.stdout.split(f"{CHUNK_MARKER}\n")[1:]
    if result.returncode != 0:
        failed = blocks[len(printed) - 1] if printed else blocks[0]
        pytest.fail(
            f"docs/r.md, block at line {failed.line} failed:\n{result.stdout[-3000:]}\n"
            f"{result.stderr[-3000:]}"
        )
    assert len(printed) == len(blocks)
    for block, output in zip(blocks, printed, strict=True):
        if block.expected_output is not None:
            assert _normalize(output) == _normalize(block.expected_output), (
                f"docs/r.md, block at line {block.line}: the printed output differs from "
                f"the ```output block after it:\n{output}"
            )
    # Placement logging and soft placement write on standard error, from Python.
    assert "statevar: Variable 'logged': create on cpu:0" in result.stderr
    assert "statevar: Variable 'logged': assign_add on cpu:0" in result.stderr
    if not any(device.platform == "gpu" for device in jax.devices()):
        assert "PlacementWarning: Device 'gpu:0' does not exist" in result.stderr


# Each case: R code run in a fresh environment of one R session, and what it must print.
# An R error in a case prints "R error: <classes>: <message>" and the session goes on.
CASES: dict[str, tuple[str, str]] = {
    "layout_is_kept": (
        """
        v <- Variable(array(1:6, c(2, 3)))
        cat(reticulate::py_str(v$value), "\\n")
        x <- array(seq(0.5, 12, by = 0.5), c(2, 3, 4))
        y <- as.array(Variable(x))
        print(identical(y, x))
        # Python's element [1, 2, 3] (from 0) is R's [2, 3, 4].
        item <- reticulate::py_get_item(Variable(x)$value, reticulate::tuple(1L, 2L, 3L))
        print(as.numeric(item) == x[2, 3, 4])
        """,
        "[[1 3 5]\n [2 4 6]] \n[1] TRUE\n[1] TRUE",
    ),
    "r_modes_and_dtypes": (
        """
        values <- list(c(1.5, 2), c(1L, 2L), c(TRUE, FALSE), c(1+2i, 3i))
        for (x in values) {
          v <- Variable(x)
          back <- as.array(v)
          cat(v$dtype, storage.mode(back), identical(as.vector(back), x), "\\n")
        }
        cat(Variable(1:3, dtype = "int8")$dtype, "\\n")
        cat(storage.mode(as.array(Variable(1:3, dtype = "int8"))), "\\n")
        cat(storage.mode(as.array(Variable(1:3, dtype = "uint32"))), "\\n")
        cat(storage.mode(as.array(Variable(c(1, 2), dtype = "float16"))), "\\n")
        """,
        "float32 double TRUE \nint32 integer TRUE \nbool logical TRUE \n"
        "complex64 complex TRUE \nint8 \ninteger \ndouble \ndouble",
    ),
    "scalars_empty_and_nan": (
        """
        s <- Variable(3L)
        print(list(as.array(s), dim(s), length(s), reticulate::py_str(s$shape)))
        e <- Variable(numeric(0))
        print(list(as.array(e), dim(e), length(e)))
        print(as.array(Variable(c(NA, 1))))
        print(as.array(Variable(array(7, 1))))
        """,
        '[[1]]\n[1] 3\n\n[[2]]\ninteger(0)\n\n[[3]]\n[1] 1\n\n[[4]]\n[1] "()"\n\n'
        "[[1]]\nnumeric(0)\n\n[[2]]\n[1] 0\n\n[[3]]\n[1] 0\n\n[1] NaN   1\n[1] 7",
    ),
    "na_integer_refused": (
        "Variable(c(1L, NA))",
        "R error: simpleError/error/condition: statevar: Variable's initial value holds NA, "
        "which integer values cannot hold in JAX (only doubles have NaN)",
    ),
    "na_logical_refused": (
        "v <- Variable(c(TRUE, FALSE)); v$assign(c(NA, TRUE))",
        "R error: simpleError/error/condition: statevar: the value given to assign holds NA, "
        "which logical values cannot hold in JAX (only doubles have NaN)",
    ),
    "non_numeric_refused": (
        'Variable(c("a", "b"))',
        "R error: simpleError/error/condition: statevar: Variable's initial value must be a "
        "numeric, integer, logical or complex vector, matrix or array; got character",
    ),
    "shape_error_is_statevar_error": (
        """
        a <- Variable(c(2, 3), name = "a")
        e <- tryCatch(a$assign(c(1, 2, 3)), error = function(e) e)
        cat(class(e), "\\n")
        cat(conditionMessage(e), "\\n")
        print(deparse(conditionCall(e)))
        print(as.array(a))
        """,
        "ShapeMismatchError statevar_error error condition \n"
        "ShapeMismatchError: Cannot assign to Variable 'a': shape (3,) does not match the "
        "variable's shape (2,) \n"
        '[1] "a$assign(c(1, 2, 3))"\n[1] 2 3',
    ),
    "dtype_error_leaves_variable": (
        """
        n <- Variable(c(1L, 2L), name = "n")
        tryCatch(n$assign_add(c(0.5, 0.5)), DtypeMismatchError = function(e) cat("caught\\n"))
        print(as.array(n))
        """,
        "caught\n[1] 1 2",
    ),
    "updates_return_the_variable": (
        """
        a <- Variable(matrix(1:4, 2), name = "a")
        b <- Variable(a)
        r <- a$assign(matrix(5:8, 2))
        print(class(r)[1:2])
        print(as.array(a$assign_add(matrix(1L, 2, 2))))
        print(as.array(a$assign_sub(1L)))
        print(as.array(b))
        """,
        '[1] "statevar_variable" "statevar_array"   \n'
        "     [,1] [,2]\n[1,]    6    8\n[2,]    7    9\n"
        "     [,1] [,2]\n[1,]    5    7\n[2,]    6    8\n"
        "     [,1] [,2]\n[1,]    1    3\n[2,]    2    4",
    ),
    "indexing_uses_r_indices": (
        """
        v <- Variable(array(1:6, c(2, 3)), name = "v")
        str(list(v[1, 2], v[, 3], v[-1, ], v[c(TRUE, FALSE)]))
        same <- v
        v[1, 2] <- 30L
        print(identical(same, v))
        print(as.array(same))
        tryCatch(v[1, 1] <- 0.5, DtypeMismatchError = function(e) cat("refused\\n"))
        print(as.array(v)[1, 1])
        """,
        "List of 4\n $ : int 3\n $ : int [1:2] 5 6\n $ : int [1:3] 2 4 6\n $ : int [1:3] 1 3 5\n"
        "[1] TRUE\n     [,1] [,2] [,3]\n[1,]    1   30    5\n[2,]    2    4    6\nrefused\n[1] 1",
    ),
    "na_operands": (
        """
        print(as.array(Variable(c(1, 2)) + NA_real_))
        Variable(1L) + NA
        """,
        "[1] NaN NaN\nR error: simpleError/error/condition: statevar: an operand holds NA, which "
        "logical values cannot hold in JAX (only doubles have NaN)",
    ),
    "operators_match_base_r": (
        """
        x <- array(c(1.5, -2, 3, 4.25, -5, 6), c(2, 3))
        y <- array(c(2, 3, -1, 0.5, 7, -2), c(2, 3))
        v <- Variable(x)
        ops <- c("+", "-", "*", "/", "^", "%%", "%/%", "==", "!=", "<", ">", "<=", ">=")
        for (op in ops) {
          f <- get(op)
          same <- all.equal(as.array(f(v, y)), f(x, y), tolerance = 1e-5) &&
            all.equal(as.array(f(y, v)), f(y, x), tolerance = 1e-5) &&
            all.equal(as.array(f(v, Variable(y))), f(x, y), tolerance = 1e-5) &&
            all.equal(as.array(f(v, 2)), f(x, 2), tolerance = 1e-5)
          cat(op, isTRUE(same), "")
        }
        cat("\\n")
        print(identical(as.array(-v), -x))
        p <- Variable(c(TRUE, FALSE, TRUE))
        print(list(as.array(p & c(TRUE, TRUE, FALSE)), as.array(p | FALSE), as.array(!p)))
        """,
        "+ TRUE - TRUE * TRUE / TRUE ^ TRUE %% TRUE %/% TRUE == TRUE != TRUE < TRUE > TRUE "
        "<= TRUE >= TRUE \n[1] TRUE\n"
        "[[1]]\n[1]  TRUE FALSE FALSE\n\n[[2]]\n[1]  TRUE FALSE  TRUE\n\n"
        "[[3]]\n[1] FALSE  TRUE FALSE",
    ),
    "operator_errors_name_the_call": (
        """
        a <- Variable(c(1, 2))
        e <- tryCatch(a * c(1, 2, 3), error = function(e) e)
        cat(class(e)[1:2], deparse(conditionCall(e)), "\\n")
        shapes <- "^TypeError: .*incompatible shapes.*[(]2,[)], [(]3,[)]"
        print(grepl(shapes, conditionMessage(e)))
        """,
        "TypeError statevar_error a * c(1, 2, 3) \n[1] TRUE",
    ),
    "weak_scalars_and_broadcasting": (
        """
        i <- Variable(c(1L, 2L))
        cat((i + 1L)$dtype, (i * 2)$dtype, "\\n")
        k <- Variable(array(1:6, c(2, 3))) * array(1:3, c(1, 3))
        print(as.array(k))
        """,
        "int32 float32 \n     [,1] [,2] [,3]\n[1,]    1    6   15\n[2,]    2    8   18",
    ),
    "python_classes_of_either_jax_dispatch": (
        """
        jnp <- reticulate::import("jax.numpy", convert = FALSE)
        raw <- jnp$ones(c(2L, 2L))
        print(any(class(raw) %in% statevar:::python_array_classes))
        print(c(length(raw), dim(raw)))
        print(as.array(raw + 1))
        # The class names JAX 0.10 and JAX 0.12 give an array, and a tracer's.
        for (name in c("jax.jaxlib._jax.Array", "jax.Array", "jax._src.core.Tracer")) {
          other <- jnp$ones(c(2L, 2L))
          class(other) <- c(name, "python.builtin.object")
          equal <- other == other
          cat(name, class(equal)[1], length(other), sum(as.array(equal)), "\\n")
        }
        """,
        "[1] TRUE\n[1] 4 2 2\n     [,1] [,2]\n[1,]    2    2\n[2,]    2    2\n"
        "jax.jaxlib._jax.Array statevar_array 4 4 \njax.Array statevar_array 4 4 \n"
        "jax._src.core.Tracer statevar_array 4 4",
    ),
    "matrix_product": (
        """
        a <- Variable(array(1:6, c(2, 3)), dtype = "float32")
        b <- array(1:6, c(3, 2))
        print(identical(as.array(a %*% b), base::`%*%`(array(1:6, c(2, 3)), b) + 0))
        m <- matrix(1:4, 2)
        print(identical(m %*% m, base::`%*%`(m, m)))
        print(as.array(b %*% Variable(c(1, 1))))
        print(as.array(Variable(c(1, 2, 3)) %*% c(1, 1, 1)))
        """,
        "[1] TRUE\n[1] TRUE\n[1] 5 7 9\n[1] 6",
    ),
    "math_and_summaries": (
        """
        x <- array(c(1, 4, 9, 16, 25, 36), c(2, 3))
        v <- Variable(x)
        print(all.equal(as.array(sqrt(v)), sqrt(x)))
        print(all.equal(as.array(log(v, 2)), log(x, 2), tolerance = 1e-6))
        print(all.equal(as.array(exp(v / 10)), exp(x / 10), tolerance = 1e-6))
        print(as.vector(cumsum(v)))
        print(as.vector(round(v / 7, 2)))
        print(sapply(list(sum(v), max(v), min(v, 0.5), mean(v)), as.numeric))
        print(as.vector(range(v, c(-1, 100))))
        print(c(as.logical(any(v > 30)), as.logical(all(v > 30))))
        print(as.array(t(v)))
        gamma(v)
        """,
        "[1] TRUE\n[1] TRUE\n[1] TRUE\n[1]  1  5 14 30 55 91\n"
        "[1] 0.14 0.57 1.29 2.29 3.57 5.14\n[1] 91.00000 36.00000  0.50000 15.16667\n"
        "[1]  -1 100\n[1]  TRUE FALSE\n"
        "     [,1] [,2]\n[1,]    1    4\n[2,]    9   16\n[3,]   25   36\n"
        "R error: simpleError/error/condition: statevar: gamma() is not supported on statevar "
        "variables and arrays; use as.array(x) first",
    ),
    "printing": (
        """
        print(Variable(matrix(c(1, 2, 3, 4), 2, byrow = TRUE), name = "m"))
        Variable(1L, trainable = FALSE)
        Variable(c(TRUE, FALSE)) == c(TRUE, TRUE)
        """,
        "<Variable 'm' shape=(2, 2) dtype=float32>\n     [,1] [,2]\n[1,]    1    2\n"
        "[2,]    3    4\n<Variable 'Variable' shape=() dtype=int32>\n[1] 1\n"
        "<Array shape=(2,) dtype=bool>\n[1]  TRUE FALSE",
    ),
    "attributes_read_as_r_values": (
        """
        v <- Variable(c(1, 2), name = "v", trainable = FALSE)
        str(list(v$name, v$trainable))
        v$trainable <- TRUE
        print(v$trainable)
        print(class(v$value)[1])
        """,
        'List of 2\n $ : chr "v"\n $ : logi FALSE\n[1] TRUE\n[1] "statevar_array"',
    ),
    "device_scope": (
        """
        with(device("cpu:0"), {
          v <- Variable(c(1, 2))
          w <- v * 2
        })
        print(reticulate::py_str(v$device$platform))
        print(as.array(w))
        with(device("nonsense"), 1)
        """,
        '[1] "cpu"\n[1] 2 4\n'
        "R error: ValueError/statevar_error/error/condition: ValueError: Cannot parse device "
        "spec 'nonsense': expected 'cpu', 'gpu' or 'tpu', optionally with an index, e.g. "
        "'gpu:0' or '/GPU:0'",
    ),
    "gradients": (
        """
        w <- Variable(c(1, 2, 3), name = "w")
        frozen <- Variable(2, name = "frozen", trainable = FALSE)
        unused <- Variable(5, name = "unused")
        f <- function() sum(w * w * frozen)
        print(as.array(grad(f, w)()))
        g <- grad(f, list(w = w, frozen = frozen, unused = unused))()
        str(lapply(g, function(x) if (is.null(x)) NULL else as.array(x)))
        h <- grad(function(scale) sum(w * scale), list(w))(c(10, 20, 30))
        print(as.array(h[[1]]))
        vg <- value_and_grad(function() mean(w^2), w)()
        print(c(as.numeric(vg$value), as.numeric(vg$grads)))
        print(as.array(w))
        """,
        "[1]  4  8 12\nList of 3\n $ w     : num [1:3(1d)] 4 8 12\n $ frozen: NULL\n"
        " $ unused: NULL\n[1] 10 20 30\n[1] 4.6666670 0.6666667 1.3333334 2.0000000\n"
        "[1] 1 2 3",
    ),
    "gradient_with_aux": (
        """
        w <- Variable(c(1, 2))
        out <- value_and_grad(function() list(sum(w * w), w * 10), w, has_aux = TRUE)()
        str(lapply(out$value, as.vector))
        print(as.vector(out$grads))
        value_and_grad(function() sum(w), w, has_aux = TRUE)()
        """,
        "List of 2\n $ : num 5\n $ : num [1:2] 10 20\n[1] 2 4\n"
        "R error: simpleError/error/condition: statevar: with has_aux = TRUE, the function "
        "must return list(value, aux)",
    ),
    "gradient_of_a_failing_function": (
        """
        w <- Variable(c(1, 2))
        loss <- function() if (TRUE) stop("no loss here")
        grad(loss, w)()
        """,
        "R error: simpleError/error/condition: no loss here",
    ),
    "gradient_wrt_must_hold_variables": (
        'grad(function() 1, "w")',
        "R error: simpleError/error/condition: statevar: wrt must be a Variable or a list of "
        "Variables; got character",
    ),
}

CASE_RUNNER = """
run_case <- function(name, code) {
  cat("@@statevar-case ", name, "\\n", sep = "")
  env <- new.env(parent = globalenv())
  tryCatch(
    for (expression in parse(text = code)) {
      result <- withVisible(eval(expression, env))
      if (result$visible) print(result$value)
    },
    error = function(e) {
      cat("R error: ", paste(class(e), collapse = "/"), ": ", conditionMessage(e), "\\n", sep = "")
    }
  )
}
suppressPackageStartupMessages(library(statevar))
"""


@pytest.fixture(scope="module")
def case_outputs(r_library, tmp_path_factory) -> dict[str, str]:
    """Runs every case in one R session; returns what each printed."""
    calls = "".join(
        f"run_case({name!r}, {textwrap.dedent(code)!r})\n" for name, (code, _) in CASES.items()
    )
    directory = tmp_path_factory.mktemp("r-cases")
    result = run_r(r_library, directory, CASE_RUNNER + calls)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    outputs = {}
    for part in result.stdout.split(CASE_MARKER)[1:]:
        name, _, printed = part.partition("\n")
        outputs[name] = printed
    return outputs


@pytest.mark.parametrize("name", list(CASES))
def test_r_package(case_outputs, name):
    assert _normalize(case_outputs[name]) == _normalize(CASES[name][1])


def test_statevar_python_finds_the_python(r_library, tmp_path):
    code = """
    library(statevar)
    v <- Variable(c(1, 2))
    cat(normalizePath(reticulate::py_config()$python), "\\n")
    print(as.array(v))
    """
    result = run_r(
        r_library,
        tmp_path,
        textwrap.dedent(code),
        RETICULATE_PYTHON=None,
        STATEVAR_PYTHON=sys.executable,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{os.path.realpath(sys.executable)} \n[1] 1 2" in result.stdout


def test_ci_installs_r_before_running_the_tests():
    # Without R, the tests above skip; CI must install it first so that they always run.
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    install = script.index("apt-get install")
    assert "r-base-core r-cran-reticulate" in script[install:].splitlines()[0]
    assert "DEBIAN_FRONTEND=noninteractive" in script[:install]
    assert install < script.index("pytest")
