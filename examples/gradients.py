"""Gradients with respect to statevar variables, printed one example at a time.

Covers what ``tf.GradientTape`` users reach for: trainable against non-trainable
variables, a loss that reads variables by closure, a loss that takes arguments, gradients
of a whole Module keyed by path name, freezing a variable, and `statevar.grad` inside
`statevar.jit`. Runs in a few seconds on CPU:

    python examples/gradients.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import statevar


def section(title: str) -> None:
    print(f"\n=== {title} ===")


def trainable_and_not() -> None:
    section("Trainable and non-trainable variables")
    # As in TensorFlow's tape example: only trainable variables get a gradient.
    w = statevar.Variable(3.0, name="w")
    not_trained = statevar.Variable(2.0, trainable=False, name="not_trained")
    grads = statevar.grad(lambda: w * w * not_trained, [w, not_trained])()
    print("y = w * w * not_trained; dy/d[w, not_trained] =", grads)
    # An integer variable is never differentiated either.
    count = statevar.Variable(5, name="count")
    print("an int32 variable's gradient:", statevar.grad(lambda: w * count, [w, count])()[1])


def closure_loss() -> None:
    section("A loss with no arguments, reading variables by closure")
    x = statevar.Variable([1.0, 2.0, 3.0], name="x")

    def loss() -> jax.Array:
        return jnp.sum(x**2)

    value, grad_x = statevar.value_and_grad(loss, x)()
    print("loss = sum(x ** 2) =", float(value), "; d loss/dx =", grad_x.tolist())


def loss_with_arguments() -> None:
    section("A loss taking arguments")
    w = statevar.Variable([[1.0], [-1.0]], name="w")
    b = statevar.Variable([0.5], name="b")

    def loss(inputs: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
        predictions = inputs @ w + b
        return jnp.mean((predictions - targets) ** 2), predictions

    inputs, targets = jnp.array([[1.0, 2.0], [3.0, 4.0]]), jnp.array([[0.0], [1.0]])
    # Gradients mirror ``wrt``: here a dict. has_aux returns the predictions too.
    (value, predictions), grads = statevar.value_and_grad(loss, {"w": w, "b": b}, has_aux=True)(
        inputs, targets
    )
    print("loss:", float(value), "; predictions:", predictions.ravel().tolist())
    print("d loss/dw:", grads["w"].ravel().tolist(), "; d loss/db:", grads["b"].tolist())


class Dense(statevar.Module):
    def __init__(self, key: jax.Array, in_features: int, out_features: int):
        self.kernel = statevar.Variable(jax.random.normal(key, (in_features, out_features)))
        self.bias = statevar.Variable(jnp.zeros(out_features))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.kernel + self.bias


class Model(statevar.Module):
    def __init__(self, key: jax.Array):
        key_1, key_2 = jax.random.split(key)
        self.layers = [Dense(key_1, 3, 4), Dense(key_2, 4, 1)]
        self.calls = statevar.Variable(0, trainable=False)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.layers[1](jax.nn.relu(self.layers[0](x)))


def module_gradients() -> Model:
    section("Gradients of a Module, keyed by path name")
    model = Model(jax.random.key(0))
    x = jnp.ones((2, 3))
    grads = statevar.grad(lambda: jnp.mean(model(x) ** 2), model)()
    for name, gradient in grads.items():
        print(f"  {name:<16}", None if gradient is None else gradient.shape)
    return model


def freezing(model: Model) -> None:
    section("Freezing a variable later")
    x = jnp.ones((2, 3))
    loss_grad = statevar.grad(lambda: jnp.mean(model(x) ** 2), model)
    model.layers[0].kernel.trainable = False
    frozen = [name for name, gradient in loss_grad().items() if gradient is None]
    print("after layers/0/kernel.trainable = False, no gradient for:", frozen)
    model.layers[0].kernel.trainable = True
    frozen = [name for name, gradient in loss_grad().items() if gradient is None]
    print("after setting it back to True:", frozen)


def grad_inside_jit() -> None:
    section("statevar.grad inside statevar.jit")
    w = statevar.Variable([1.0, -2.0, 3.0], name="w")
    learning_rate = 0.25

    @statevar.jit
    def sgd_step(target: jax.Array) -> jax.Array:
        loss, grad_w = statevar.value_and_grad(lambda: jnp.sum((w - target) ** 2), w)()
        w.assign_sub(learning_rate * grad_w)
        return loss

    target = jnp.zeros(3)
    for _ in range(3):
        loss = sgd_step(target)
        print(f"loss before the step {float(loss):6.3f}; w after: {w.numpy().tolist()}")


def main() -> None:
    trainable_and_not()
    closure_loss()
    loss_with_arguments()
    model = module_gradients()
    freezing(model)
    grad_inside_jit()


if __name__ == "__main__":
    main()
