"""A tour of statevar variables: the walkthrough of docs/variables.md as a script.

Creates variables, updates them in place, shows the errors a wrong update raises, and
places variables on devices, printing what each step shows. Runs in a few seconds on CPU:

    python examples/variables_tour.py

On a machine without a GPU, asking for ``"gpu:0"`` falls back to the CPU (soft device
placement); the tour catches that `statevar.PlacementWarning` and prints it.
"""

from __future__ import annotations

import logging
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import statevar


def section(title: str) -> None:
    print(f"\n=== {title} ===")


def create() -> statevar.Variable:
    section("Create a variable")
    my_array = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    my_variable = statevar.Variable(my_array)
    bool_variable = statevar.Variable([False, False, False, True])
    complex_variable = statevar.Variable([5 + 4j, 6 + 1j])
    for variable in (my_variable, bool_variable, complex_variable):
        print(repr(variable))
    print("Shape:", my_variable.shape, " DType:", my_variable.dtype)
    print("As NumPy:", my_variable.numpy().tolist())
    defaults = {
        "1": statevar.Variable(1).dtype,
        "1.0": statevar.Variable(1.0).dtype,
        "np.array([1, 2])": statevar.Variable(np.array([1, 2])).dtype,
    }
    print("Default dtypes (64-bit off, as in JAX):", {k: str(v) for k, v in defaults.items()})
    print("Index of highest value (axis 0):", jnp.argmax(my_variable, axis=0))
    print("Copying and reshaping:", jnp.reshape(my_variable, (1, 4)))
    result = my_variable + 1
    print("my_variable + 1 is a plain jax.Array:", isinstance(result, jax.Array), result.tolist())
    return my_variable


def update() -> None:
    section("Update and reshape")
    a = statevar.Variable([2.0, 3.0])
    print("assign([1, 2]) keeps float32:", a.assign([1, 2]).numpy())
    try:
        a.assign([1.0, 2.0, 3.0])
    except ValueError as error:
        print(f"Caught {type(error).__name__}: {error}")

    counter = statevar.Variable([1, 2], name="counter")
    try:
        counter.assign([1.5, 2.5])
    except TypeError as error:
        print(f"Caught {type(error).__name__}: {error}")
    print("counter unchanged after the rejected assign:", counter.numpy())

    before = a.value
    a.assign_add([10.0, 10.0])
    print("A read taken before assign_add stays valid:", before, "-> now", a.value)
    del before  # with no read outstanding, the next update donates the buffer again

    a = statevar.Variable([2.0, 3.0])
    b = statevar.Variable(a)
    a.assign([5, 6])
    print("a:", a.numpy(), " b (a copy made earlier):", b.numpy())
    print("a.assign_add([2, 3]):", a.assign_add([2, 3]).numpy())
    print("a.assign_sub([7, 9]):", a.assign_sub([7, 9]).numpy())

    v = statevar.Variable([1.0, 2.0, 3.0])
    v[0] = 9.0
    v[1:] = [7.0, 8.0]
    print("After v[0] = 9 and v[1:] = [7, 8]:", v.numpy())


def lifecycle(my_variable: statevar.Variable) -> None:
    section("Lifecycle, naming and watching")
    a = statevar.Variable(my_variable, name="Mark")
    b = statevar.Variable(my_variable + 1, name="Mark")
    print("Same name, different values; a == b:", (a == b).tolist())
    print("Names:", a.name, b.name)
    step_counter = statevar.Variable(1, trainable=False)
    print(repr(step_counter), "trainable:", step_counter.trainable)


def placement() -> None:
    section("Placing variables and tensors")
    print("Devices:", ", ".join(str(device) for device in jax.devices()))
    with statevar.device("cpu:0"):
        a = statevar.Variable([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        b = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
        c = a @ b
    print("a @ b in a cpu:0 scope:", c.tolist(), "on", a.device)

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("  [log] %(name)s: %(message)s"))
    logger = logging.getLogger("statevar")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    statevar.set_log_device_placement(True)
    try:
        print("With placement logging on:")
        logged = statevar.Variable([1.0, 2.0], name="logged", device="cpu:0")
        logged.assign_add([1.0, 1.0])
    finally:
        statevar.set_log_device_placement(False)
        logger.removeHandler(handler)

    with statevar.device("cpu:0"):
        a = statevar.Variable([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        b = statevar.Variable([[1.0, 2.0, 3.0]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", statevar.PlacementWarning)
        with statevar.device("gpu:0") as used:
            k = a * b
    print(f"a * b in a gpu:0 scope ran on {used}:", k.tolist())
    for warning in caught:
        expected = issubclass(warning.category, statevar.PlacementWarning)
        label = "Soft placement fell back, as expected" if expected else "Unexpected warning"
        print(f"{label}: {warning.category.__name__}: {warning.message}")

    statevar.set_soft_device_placement(False)
    try:
        statevar.Variable([1.0, 2.0], device="gpu:99")
    except statevar.PlacementError as error:
        print(f"With soft placement off, caught {type(error).__name__}: {error}")
    finally:
        statevar.set_soft_device_placement(True)


def main() -> None:
    print(f"statevar {statevar.__version__} on jax {jax.__version__}")
    my_variable = create()
    update()
    lifecycle(my_variable)
    placement()


if __name__ == "__main__":
    main()
