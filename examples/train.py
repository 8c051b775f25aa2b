"""Trains a small MLP on a synthetic regression task with statevar.

The model is a `statevar.Module` with dropout between its layers while training, its masks
drawn from a `statevar.random.Generator` the model holds; each training step is one
`statevar.jit` call that computes the loss and gradients with `statevar.value_and_grad`,
applies Adam through a `statevar.Optimizer` and advances a non-trainable step counter, all
updated in place in donated buffers (the generator's key too: each step draws new masks,
with no key argument). The step counter also picks the mini-batch, so the run is deterministic:
the same seed and step give the same batch. Runs in a few seconds on CPU:

    python examples/train.py [--steps 2000] [--dropout 0.1] [--save-every 500]
                             [--checkpoint-dir checkpoints]

Prints a summary table of the model first. A `statevar.CheckpointManager` saves the
model, the step counter and the optimizer every ``--save-every`` steps and at the last
step, keeping this run's last ``--keep`` checkpoints; a run never deletes a checkpoint it
did not make. ``--resume`` restores the latest checkpoint and trains on from its step to
``--steps``, exactly as an uninterrupted run would. Without ``--resume``, a
``--checkpoint-dir`` that already holds checkpoints stops the run (exit status 2) before
anything is trained or deleted:

    python examples/train.py --steps 1000             # stops early, as a preempted job would
    python examples/train.py --steps 2000 --resume    # carries on from step 1000

Prints the loss on the whole data set before and after training, writes the curve of the
training loss to ``loss.png`` beside the checkpoints, and fails (exit status 1) unless the
final loss is at most ``--max-loss-ratio`` times the loss of the untrained model.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
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
    """A multilayer perceptron with ReLU between its layers, and dropout after each ReLU
    while training (inverted dropout: the units kept are scaled by ``1 / (1 - rate)``)."""

    def __init__(self, key: jax.Array, sizes: Sequence[int], dropout_rate: float = 0.0):
        layers_key, dropout_key = jax.random.split(key)
        keys = jax.random.split(layers_key, len(sizes) - 1)
        shapes = zip(sizes[:-1], sizes[1:], strict=True)
        self.layers = [Dense(k, n_in, n_out) for k, (n_in, n_out) in zip(keys, shapes, strict=True)]
        self.dropout_rate = dropout_rate
        # Draws the dropout masks. Its key is a variable of the model ("rng/state"), saved
        # with it, so a resumed run drops the same units as an uninterrupted one.
        self.rng = statevar.random.Generator.from_key(dropout_key)

    def __call__(self, x: jax.Array, training: bool = False) -> jax.Array:
        for layer in self.layers[:-1]:
            x = jax.nn.relu(layer(x))
            if training and self.dropout_rate > 0:
                keep = self.rng.bernoulli(x.shape, 1.0 - self.dropout_rate)
                x = jnp.where(keep, x / (1.0 - self.dropout_rate), 0.0)
        return self.layers[-1](x)


class Run(NamedTuple):
    """What `main` did: the losses on the whole data set and the state it ended with."""

    first: float  # the loss of the untrained model, at step 0
    final: float  # the loss after training
    resumed_from: int | None  # the step restored with --resume; None for a fresh start
    step: int  # the step counter at the end
    model: MLP


@functools.partial(jax.jit, static_argnums=1)  # one compiled call instead of one per operation
def make_dataset(key: jax.Array, num_examples: int = NUM_EXAMPLES) -> tuple[jax.Array, jax.Array]:
    """Returns inputs ``x`` and targets ``y``: a linear trend plus a smooth nonlinear part."""
    key_x, key_a, key_b = jax.random.split(key, 3)
    x = jax.random.normal(key_x, (num_examples, IN_FEATURES))
    projection = jax.random.normal(key_a, (IN_FEATURES, 8)) / jnp.sqrt(IN_FEATURES)
    readout = jax.random.normal(key_b, (8, 1))
    y = (x @ projection + 0.3 * jnp.sin(x @ projection)) @ readout
    return x, y


def mean_squared_error(model: MLP, x: jax.Array, y: jax.Array, training: bool = False) -> jax.Array:
    return jnp.mean((model(x, training) - y) ** 2)


def make_train_step(
    model: MLP, optimizer: statevar.Optimizer, step: statevar.Variable, batch_size: int
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """Returns the compiled training step: ``train_step(x, y)`` returns the batch loss.

    Each call trains on the mini-batch that ``step`` selects from ``x`` and ``y``, with new
    dropout masks, updates ``model`` (its generator's key included), the optimizer's state
    and ``step`` in place (their buffers are donated), and leaves ``x`` and ``y`` untouched.
    """
    loss_and_grads = statevar.value_and_grad(
        lambda xb, yb: mean_squared_error(model, xb, yb, training=True), model
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
    save: Callable[[int], None],
    save_every: int,
    log_every: int = 50,
) -> list[tuple[int, float]]:
    """Runs ``train_step`` until ``step`` reaches ``num_steps``, showing a progress bar.

    Starts from the current value of ``step``, so a run restored at step ``n`` carries on
    from there. Calls ``save(current_step)`` every ``save_every`` steps and after the last
    step. The loss shown is read back only every ``log_every`` steps (and at the last), so
    that the host does not wait for the device after each step.

    Returns:
      The ``(step, batch loss)`` pairs read back, for the loss curve.
    """
    history: list[tuple[int, float]] = []
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
                history.append((current, float(loss)))
                progress.update(task, completed=current, loss=f"{history[-1][1]:.5f}")
            if current % save_every == 0 or current == num_steps:
                save(current)
    return history


def plot_loss(history: Sequence[tuple[int, float]], path: pathlib.Path) -> None:
    """Writes the loss curve to ``path`` as a PNG, with matplotlib's Agg backend (no window,
    and no change to pyplot's global state)."""
    figure = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.plot([s for s, _ in history], [loss for _, loss in history], marker=".")
    axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel("mini-batch loss (MSE)")
    axes.set_title("examples/train.py")
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)


def main(argv: Sequence[str] | None = None) -> Run:
    """Builds the data, model and optimizer, trains with checkpoints, and checks the loss fell.

    Returns:
      The losses before and after training, the step restored from and reached, and the
      trained model.

    Raises:
      SystemExit: with status 1 if the final loss is above ``--max-loss-ratio`` times the
        first, and with status 2 if an argument is invalid.
    """
    parser = argparse.ArgumentParser(description="Train a small MLP with statevar.")
    parser.add_argument("--steps", type=int, default=2000, help="training steps (default 2000)")
    parser.add_argument("--batch-size", type=int, default=128, help="examples per step")
    parser.add_argument("--learning-rate", type=float, default=3e-3, help="Adam's step size")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the data, weights and dropout masks"
    )
    parser.add_argument(
        "--dropout", type=float, default=0.1, help="dropout rate while training (default 0.1)"
    )
    parser.add_argument(
        "--max-loss-ratio",
        type=float,
        default=0.01,
        help="fail unless final loss <= this times the first loss (default 0.01)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        default="checkpoints",
        help="where checkpoints go, relative to the current directory (default checkpoints)",
    )
    parser.add_argument(
        "--save-every",
        type=int,
        default=500,
        help="save a checkpoint every this many steps, and at the last (default 500)",
    )
    parser.add_argument(
        "--keep",
        type=int,
        default=5,
        help="how many of this run's checkpoints to keep (default 5)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in --checkpoint-dir; without it, a "
        "--checkpoint-dir holding checkpoints stops the run",
    )
    args = parser.parse_args(argv)
    if not 0 < args.batch_size <= NUM_EXAMPLES:
        parser.error(f"--batch-size must be between 1 and {NUM_EXAMPLES}, got {args.batch_size}")
    if not 0 <= args.dropout < 1:
        parser.error(f"--dropout must be at least 0 and below 1, got {args.dropout}")
    if args.save_every < 1:
        parser.error(f"--save-every must be a positive number of steps, got {args.save_every}")
    if args.keep < 1:
        parser.error(f"--keep must be a positive number of checkpoints, got {args.keep}")
    if os.path.exists(args.checkpoint_dir) and not os.path.isdir(args.checkpoint_dir):
        parser.error(f"--checkpoint-dir {args.checkpoint_dir!r} exists and is not a directory")

    # Every checkpoint there belongs to another run: never delete one this run did not make.
    manager = statevar.CheckpointManager(args.checkpoint_dir, max_to_keep=None)
    existing = manager.all_steps()
    if existing and not args.resume:
        parser.error(
            f"--checkpoint-dir {args.checkpoint_dir!r} already holds the checkpoints of steps "
            f"{existing}: pass --resume to continue from step {existing[-1]}, or choose "
            "another --checkpoint-dir (delete those checkpoints yourself to start over there)"
        )

    data_key, model_key = jax.random.split(jax.random.key(args.seed))
    x, y = make_dataset(data_key)
    model = MLP(model_key, [IN_FEATURES, HIDDEN, 1], dropout_rate=args.dropout)
    optimizer = statevar.Optimizer(optax.adam, model, learning_rate=args.learning_rate)
    step = statevar.Variable(0, trainable=False, name="step")
    train_step = make_train_step(model, optimizer, step, args.batch_size)
    evaluate = statevar.jit(lambda x, y: mean_squared_error(model, x, y))
    model.summary()

    # The step counter and the optimizer (its iterations and Adam's moments, named
    # optimizer/mu/layers/0/kernel and so on) are saved with the model (its dropout
    # generator's key, rng/state, included), so that a resumed run continues exactly where
    # it stopped.
    state = {"model": model, "step": step, "optimizer": optimizer}

    # The untrained model's loss, the yardstick of the convergence check, is the same for a
    # resumed run: the seed fixes the initial weights.
    first = float(evaluate(x, y))
    print(f"first loss: {first:.6f} (step {int(step.value)})")
    resumed_from = None
    if args.resume:
        restored = manager.restore(state)
        if restored is None:
            print(f"no checkpoint in {args.checkpoint_dir!r} to resume from: starting at step 0")
        else:
            resumed_from = restored.step
            loss = float(evaluate(x, y))
            print(f"resumed from step {resumed_from} in {args.checkpoint_dir!r} (loss {loss:.6f})")
    if int(step.value) >= args.steps:
        print(f"nothing to train: step {int(step.value)} already reaches --steps {args.steps}")

    saved: list[int] = []  # the steps this run saved, the only ones it may delete

    def save(current: int) -> None:
        manager.save(current, state)
        saved.append(current)
        print(f"saved step {current} to {args.checkpoint_dir!r}")
        while len(saved) > args.keep:
            manager.delete(saved.pop(0))

    history = train(train_step, step, x, y, args.steps, save, args.save_every)
    if history:
        curve = pathlib.Path(args.checkpoint_dir) / "loss.png"
        plot_loss(history, curve)
        print(f"wrote the loss curve to {str(curve)!r}")
    final = float(evaluate(x, y))
    print(f"final loss: {final:.6f} (step {int(step.value)}), {final / first:.2%} of the first")
    if not final <= args.max_loss_ratio * first:
        print(
            f"error: final loss {final:.6f} is above {args.max_loss_ratio:g} x the first loss "
            f"{first:.6f}: training did not converge",
            file=sys.stderr,
        )
        raise SystemExit(1)
    return Run(first, final, resumed_from, int(step.value), model)


if __name__ == "__main__":
    main()
