"""Trains with many steps per compiled call: `jax.lax.scan` inside `statevar.jit`.

Each call of ``train_chunk`` runs ``--steps-per-call`` training steps in one compiled
call, scanning over a stack of batches. Each step accumulates the gradients of
``--micro-batches`` micro-batches in an inner scan, then applies Adam once through a
`statevar.Optimizer` and advances a step counter, all variables updated in place in
donated buffers. A step whose loss is not finite is skipped with `jax.lax.cond`: neither
the model nor the optimizer's state changes, and a ``skipped`` counter records it. The
data has a corrupted (NaN) batch every ``--corrupt-every`` steps to show it.

    python examples/train_scan.py [--steps 400] [--steps-per-call 50] [--micro-batches 4]

The script checks that the first call, running K steps, leaves the model, the optimizer's
state and the counters exactly as K separate calls of the same step leave a twin model.
Prints the loss before and after training and fails (exit status 1) unless the final loss
is at most ``--max-loss-ratio`` times the untrained model's, or the check fails.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

import statevar

IN_FEATURES = 8
HIDDEN = 32
MICRO_BATCH = 16


class MLP(statevar.Module):
    """Two dense layers with a ReLU between them, and the training counters."""

    def __init__(self, key: jax.Array):
        key_1, key_2 = jax.random.split(key)
        self.kernel_1 = statevar.Variable(
            jax.random.normal(key_1, (IN_FEATURES, HIDDEN)) * jnp.sqrt(2.0 / IN_FEATURES)
        )
        self.bias_1 = statevar.Variable(jnp.zeros(HIDDEN))
        self.kernel_2 = statevar.Variable(
            jax.random.normal(key_2, (HIDDEN, 1)) * jnp.sqrt(2.0 / HIDDEN)
        )
        self.bias_2 = statevar.Variable(jnp.zeros(1))
        self.step = statevar.Variable(0, trainable=False, name="step")
        self.skipped = statevar.Variable(0, trainable=False, name="skipped")

    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = jax.nn.relu(x @ self.kernel_1 + self.bias_1)
        return (hidden @ self.kernel_2 + self.bias_2)[:, 0]


class Trainer(statevar.Module):
    """A model, its optimizer and the compiled steps that train it."""

    def __init__(self, seed: int, learning_rate: float):
        self.model = MLP(jax.random.key(seed))
        self.optimizer = statevar.Optimizer(optax.adam(learning_rate), self.model)
        self.loss_and_grads = statevar.value_and_grad(self.loss, self.model)

    def loss(self, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((self.model(x) - y) ** 2)

    def step(self, x: jax.Array, y: jax.Array) -> jax.Array:
        """One training step on micro-batches ``x[i], y[i]``; returns their mean loss.

        Traced inside `train_chunk`'s scan, or compiled on its own by `train_step`.
        """

        def accumulate(total, batch):
            loss, grads = self.loss_and_grads(*batch)
            return {name: total[name] + grads[name] / len(x) for name in total}, loss

        variables = self.model.named_variables()
        zeros = {name: jnp.zeros(v.shape) for name, v in variables.items() if v.trainable}
        total, losses = jax.lax.scan(accumulate, zeros, (x, y))
        loss = losses.mean()

        def update():
            # The counters are not trained: their slots hold None.
            self.optimizer.apply({name: total.get(name) for name in variables})
            self.model.step.assign_add(1)

        def skip():
            self.model.skipped.assign_add(1)

        jax.lax.cond(jnp.isfinite(loss), update, skip)
        return loss

    @statevar.jit
    def train_step(self, x: jax.Array, y: jax.Array) -> jax.Array:
        """One step per compiled call."""
        return self.step(x, y)

    @statevar.jit
    def train_chunk(self, xs: jax.Array, ys: jax.Array) -> jax.Array:
        """``len(xs)`` steps in one compiled call; returns each step's loss."""

        def one_step(carry, batch):
            return carry, self.step(*batch)

        return jax.lax.scan(one_step, None, (xs, ys))[1]


def make_data(
    key: jax.Array, steps: int, micro_batches: int, corrupt_every: int
) -> tuple[jax.Array, jax.Array]:
    """Batches of a noisy linear-plus-sine regression, shaped (steps, micro, batch, ...).

    Every ``corrupt_every``-th step's inputs are NaN (none if ``corrupt_every`` is 0).
    """
    key_x, key_noise = jax.random.split(key)
    true_w = jax.random.normal(jax.random.key(1234), (IN_FEATURES,))  # the same task always
    x = jax.random.normal(key_x, (steps, micro_batches, MICRO_BATCH, IN_FEATURES))
    y = x @ true_w + jnp.sin(x[..., 0]) + 0.05 * jax.random.normal(key_noise, x.shape[:-1])
    if corrupt_every:
        corrupted = (jnp.arange(steps) % corrupt_every) == corrupt_every - 1
        x = jnp.where(corrupted[:, None, None, None], jnp.nan, x)
    return x, y


def same_state(a: Trainer, b: Trainer) -> bool:
    """Whether two trainers' models and optimizer states are equal, bit for bit."""
    values_a, values_b = (
        statevar.read_values([t.model, t.optimizer.state_variables]) for t in (a, b)
    )
    return jax.tree.all(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), values_a, values_b))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--steps-per-call", type=int, default=50)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--corrupt-every", type=int, default=25)
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-loss-ratio", type=float, default=0.2)
    args = parser.parse_args(argv)
    for name in ("steps", "steps_per_call", "micro_batches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.steps % args.steps_per_call:
        parser.error("--steps must be a multiple of --steps-per-call")
    if args.corrupt_every < 0:
        parser.error("--corrupt-every must be 0 (no corrupted batch) or more")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the check and the training; returns the exit status."""
    args = parse_args(argv)
    trainer = Trainer(args.seed, args.learning_rate)
    xs, ys = make_data(
        jax.random.key(args.seed + 1), args.steps, args.micro_batches, args.corrupt_every
    )
    test_x, test_y = make_data(jax.random.key(args.seed + 2), 1, 16, corrupt_every=0)
    test_x, test_y = test_x.reshape(-1, IN_FEATURES), test_y.reshape(-1)
    first = float(trainer.loss(test_x, test_y))
    print(f"loss before training: {first:.4f}")
    chunk = args.steps_per_call
    # A twin trainer takes the first chunk's steps one call each, for comparison.
    twin = Trainer(args.seed, args.learning_rate)
    for x, y in zip(xs[:chunk], ys[:chunk], strict=True):
        twin.train_step(x, y)
    matches = None
    for start in range(0, args.steps, chunk):
        losses = trainer.train_chunk(xs[start : start + chunk], ys[start : start + chunk])
        if matches is None:
            matches = same_state(trainer, twin)
            print(f"{chunk} steps in one call equal {chunk} separate calls: {matches}")
        finite = losses[jnp.isfinite(losses)]
        print(
            f"steps {start + 1}-{start + chunk}: mean loss {float(finite.mean()):.4f}, "
            f"{int(trainer.model.step)} applied, {int(trainer.model.skipped)} skipped"
        )
    last = float(trainer.loss(test_x, test_y))
    print(f"loss after training: {last:.4f} ({last / first:.1%} of the first)")
    return 0 if matches and last <= args.max_loss_ratio * first else 1


if __name__ == "__main__":
    sys.exit(main())
