"""A user's type checker (pyright) accepts statevar's public API and its types mean something.

Runs pyright on the package and on small user programs written to a temporary directory.
The `pyright[nodejs]` test dependency brings its own Node.js, so nothing is downloaded.
"""

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

_USER_PROGRAM = """
import jax
import jax.numpy as jnp
import optax
import statevar


class Dense(statevar.Module):
    def __init__(self, width: int) -> None:
        self.kernel = statevar.Variable(jnp.ones((width, width)))
        self.bias = statevar.Variable(jnp.zeros((width,)))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.kernel + self.bias


v = statevar.Variable(1.0, name="v")
total: jax.Array = v + 1
total = 1 + v
total = -v
total = abs(v) * 2 - v / 3 @ jnp.ones(())
total = v + [1.0, 1.0]
total = v * (2.0, 2.0)
total = (2.0, 2.0) - v
total = [[1.0, 2.0]] @ v
mask: jax.Array = v < 0
same: jax.Array = v == v
updated: statevar.Variable = v.assign_add(1.0)
v.assign(v * 2)
nothing: None = v.assign_sub(1.0, read_value=False)
again: statevar.Variable = v.assign(3.0, use_locking=True, name="set")
as_float: float = float(v)

model = Dense(2)
optimizer = statevar.Optimizer(optax.sgd, learning_rate=0.1)


@statevar.jit
def step(x: jax.Array, scale: float) -> jax.Array:
    loss = jnp.sum(model(x)) * scale
    optimizer.apply_gradients([(jnp.ones((2, 2)), model.kernel)])
    return loss


@statevar.jit(static_argnames="n")
def repeat(x: jax.Array, n: int) -> jax.Array:
    return x * n


loss: jax.Array = step(jnp.ones((2,)), 0.5)
repeated: jax.Array = repeat(jnp.ones(()), n=3)
lowered: jax.stages.Lowered = step.lower(jnp.ones((2,)), 0.5)
"""

_WRONG_CALLS = """
import jax
import jax.numpy as jnp
import statevar


@statevar.jit
def step(x: jax.Array, scale: float) -> jax.Array:
    return x * scale


step(jnp.ones(2))  # missing scale
step(jnp.ones(2), "half")  # a str for a float
text: str = step(jnp.ones(2), 0.5)  # an Array is no str
"""


def _pyright(*paths: str, cwd: pathlib.Path) -> list[dict]:
    """Runs pyright (basic mode) on ``paths``; returns its error diagnostics."""
    if cwd != ROOT:
        # The test install is editable: setuptools reaches statevar through an import hook,
        # which a static checker does not follow. A wheel installs these same files.
        (cwd / "pyrightconfig.json").write_text(json.dumps({"extraPaths": [str(ROOT)]}))
    completed = subprocess.run(
        [sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable]
        + list(paths),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        report = json.loads(completed.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"pyright did not run:\n{completed.stdout}\n{completed.stderr}")
    return [d for d in report["generalDiagnostics"] if d["severity"] == "error"]


def _shown(errors: list[dict]) -> str:
    return "\n".join(
        f"{e['file']}:{e['range']['start']['line'] + 1}: {e['message']}" for e in errors
    )


def test_the_package_type_checks_clean():
    errors = _pyright("statevar", cwd=ROOT)
    assert errors == [], _shown(errors)


def test_a_user_program_using_the_public_api_type_checks(tmp_path):
    (tmp_path / "program.py").write_text(textwrap.dedent(_USER_PROGRAM))
    errors = _pyright("program.py", cwd=tmp_path)
    assert errors == [], _shown(errors)


def test_a_compiled_function_called_with_wrong_arguments_is_reported(tmp_path):
    program = textwrap.dedent(_WRONG_CALLS)
    (tmp_path / "program.py").write_text(program)
    errors = _pyright("program.py", cwd=tmp_path)
    wrong = [i for i, line in enumerate(program.splitlines()) if line.startswith(("step", "text"))]
    assert sorted({e["range"]["start"]["line"] for e in errors}) == wrong, _shown(errors)
