"""Trains a small MLP on a synthetic regression task with statevar.

The model is a `statevar.Module`; each training step is one `statevar.jit` call that
computes the loss and gradients with `statevar.value_and_grad`, applies Adam through a
`statevar.Optimizer` and advances a non-trainable step counter, all updated in place in
donated buffers. The step counter also picks the mini-batch, so the run is deterministic:
the same seed and step give the same batch. Runs in a few seconds on CPU:

    python examples/train.py [--steps 2000]

Prints the loss on the whole data set before and after training and fails (exit status 1)
unless the final loss is at most ``--max-loss-ratio`` times the first.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import statevar

IN_FEATURES = 32
HIDDEN = 64
NUM_EXAMPLES = 4096


class Dense(statevar.Module):
    """A fully connected layer, ``x @ kernel + bias``, with He-initialized weights."""

    def __init__(self, key: jax.Array, in_features: int, out_features: int):
        scale = jnp.sqrt(2.0 / in_features)
        self.kernel = statevar.Variable(jax.random.normal(key, (in_features, out_features)) * scale)
        self.bias = statevar.Variable(jnp.zeros(out_features))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.kernel + self.bias


class MLP(statevar.Module):
    """A multilayer perceptron with ReLU between its layers."""

    def __init__(self, key: jax.Array, sizes: Sequence[int]):
        keys = jax.random.split(key, len(sizes) - 1)
        shapes = zip(sizes[:-1], sizes[1:], strict=True)
        self.layers = [Dense(k, n_in, n_out) for k, (n_in, n_out) in zip(keys, shapes, strict=True)]

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers[:-1]:
            x = jax.nn.relu(layer(x))
        return self.layers[-1](x)


class Losses(NamedTuple):
    """The loss on the whole data set before and after training."""

    first: float
    final: float


@functools.partial(jax.jit, static_argnums=1)  # one compiled call instead of one per operation
def make_dataset(key: jax.Array, num_examples: int = NUM_EXAMPLES) -> tuple[jax.Array, jax.Array]:
    """Returns inputs ``x`` and targets ``y``: a linear trend plus a smooth nonlinear part."""
    key_x, key_a, key_b = jax.random.split(key, 3)
    x = jax.random.normal(key_x, (num_examples, IN_FEATURES))
    projection = jax.random.normal(key_a, (IN_FEATURES, 8)) / jnp.sqrt(IN_FEATURES)
    readout = jax.random.normal(key_b, (8, 1))
    y = (x @ projection + 0.3 * jnp.sin(x @ projection)) @ readout
    return x, y


def mean_squared_error(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


def make_train_step(
    model: MLP, optimizer: statevar.Optimizer, step: statevar.Variable, batch_size: int
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """Returns the compiled training step: ``train_step(x, y)`` returns the batch loss.

    Each call trains on the mini-batch that ``step`` selects from ``x`` and ``y``, updates
    ``model``, the optimizer's state and ``step`` in place (their buffers are donated), and
    leaves ``x`` and ``y`` untouched.
    """
    loss_and_grads = statevar.value_and_grad(
        lambda xb, yb: mean_squared_error(model, xb, yb), model
    )

    @statevar.jit
    def train_step(x: jax.Array, y: jax.Array) -> jax.Array:
        start = (step.value % (x.shape[0] // batch_size)) * batch_size
        xb = lax.dynamic_slice_in_dim(x, start, batch_size)
        yb = lax.dynamic_slice_in_dim(y, start, batch_size)
        loss, grads = loss_and_grads(xb, yb)
        optimizer.apply(grads)
        step.assign_add(1)
        return loss

    return train_step


def train(
    train_step: Callable[[jax.Array, jax.Array], jax.Array],
    step: statevar.Variable,
    x: jax.Array,
    y: jax.Array,
    num_steps: int,
    log_every: int = 50,
) -> None:
    """Runs ``train_step`` until ``step`` reaches ``num_steps``, showing a progress bar.

    Starts from the current value of ``step``, so a run restored at step ``n`` carries on
    from there. The loss shown is read back only every ``log_every`` steps, so that the
    host does not wait for the device after each step.
    """
    start = int(step.value)
    columns = (
        TextColumn("[bold]training"),
        BarColumn(),
        TextColumn("step"),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns) as progress:
        task = progress.add_task("train", total=num_steps, completed=start, loss="-")
        for current in range(start + 1, num_steps + 1):
            loss = train_step(x, y)
            if current % log_every == 0 or current == num_steps:
                progress.update(task, completed=current, loss=f"{float(loss):.5f}")


def main(argv: Sequence[str] | None = None) -> Losses:
    """Builds the data, model and optimizer, trains, and checks that the loss fell.

    Returns:
      The loss on the whole data set before and after training.

    Raises:
      SystemExit: with status 1 if the final loss is above ``--max-loss-ratio`` times the
        first.
    """
    parser = argparse.ArgumentParser(description="Train a small MLP with statevar.")
    parser.add_argument("--steps", type=int, default=2000, help="training steps (default 2000)")
    parser.add_argument("--batch-size", type=int, default=128, help="examples per step")
    parser.add_argument("--learning-rate", type=float, default=3e-3, help="Adam's step size")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and weights")
    parser.add_argument(
        "--max-loss-ratio",
        type=float,
        default=0.01,
        help="fail unless final loss <= this times the first loss (default 0.01)",
    )
    args = parser.parse_args(argv)
    if not 0 < args.batch_size <= NUM_EXAMPLES:
        parser.error(f"--batch-size must be between 1 and {NUM_EXAMPLES}, got {args.batch_size}")

    data_key, model_key = jax.random.split(jax.random.key(args.seed))
    x, y = make_dataset(data_key)
    model = MLP(model_key, [IN_FEATURES, HIDDEN, 1])
    optimizer = statevar.Optimizer(optax.adam(args.learning_rate), model)
    step = statevar.Variable(0, trainable=False, name="step")
    train_step = make_train_step(model, optimizer, step, args.batch_size)
    evaluate = statevar.jit(lambda x, y: mean_squared_error(model, x, y))

    first = float(evaluate(x, y))
    print(f"first loss: {first:.6f} (step {int(step.value)})")
    train(train_step, step, x, y, args.steps)
    final = float(evaluate(x, y))
    print(f"final loss: {final:.6f} (step {int(step.value)}), {final / first:.2%} of the first")
    if not final <= args.max_loss_ratio * first:
        print(
            f"error: final loss {final:.6f} is above {args.max_loss_ratio:g} x the first loss "
            f"{first:.6f}: training did not converge",
            file=sys.stderr,
        )
        raise SystemExit(1)
    return Losses(first, final)


if __name__ == "__main__":
    main()
