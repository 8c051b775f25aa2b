"""Per-step cost of a training step: statevar.jit against pure jax.jit and flax nnx.jit.

Times the same step (forward, gradients, optax update) written three ways, in one run,
and prints microseconds per step side by side with the ratio to pure `jax.jit`:

- MLP 32 -> 64 -> 1, batch 16, ``optax.sgd``: `statevar.jit` (`statevar.value_and_grad`
  and `statevar.Optimizer.apply`), a hand-written `jax.jit` step donating the parameters,
  the optimizer state and the step count (``donate_argnums``), and `flax.nnx.jit`
  (``nnx.Linear`` layers, ``nnx.Optimizer``). All three count their steps, as an optimizer
  does (`statevar.Optimizer.iterations`, ``nnx.Optimizer.step``): the same arithmetic.
- 1,000 variables of shape f32[4], ``optax.sgd``: `statevar.jit` against `jax.jit`, where
  the per-variable cost of a call dominates.
- 50 MLP steps in one call (``jax.lax.scan`` over batches), a 2-block transformer with
  adam, and an eager `statevar.Optimizer.apply` against a donated `jax.jit` of the optax
  update.

Each variant runs ``--steps-per-round`` steps back to back (dispatch is asynchronous, as in a
training loop) and waits for the last one; the variants take turns round after round, so
that drifting machine load hits them alike, in the order of `schedule.turns`: each runs
right after each other one equally often. The reported time is the
median over rounds of the mean step time within a round. Targets (`TARGETS`): statevar at
most 1.10x pure jax on the MLP, 1.2x with 1,000 variables, 1.02x for the scan, 1.05x for
the transformer and 1.15x for the eager update; a miss prints FAIL (the script still exits
0: it reports, it does not gate).

    python benchmarks/train_step.py [--rounds 60] [--steps-per-round 50]
"""

from __future__ import annotations

import argparse
import functools
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from schedule import turns

import statevar

IN_FEATURES, HIDDEN, OUT_FEATURES, BATCH = 32, 64, 1, 16
NUM_SMALL_VARIABLES, SMALL_SIZE = 1000, 4
LEARNING_RATE = 1e-3
TARGETS = {
    "MLP": 1.10,
    "1,000 variables": 1.2,
    "scan": 1.02,
    "transformer": 1.05,
    "eager Optimizer.apply": 1.15,
}


# ----------------------------------------------------------------------------- data


def make_batch() -> tuple[jax.Array, jax.Array]:
    key_x, key_y = jax.random.split(jax.random.key(0))
    return (
        jax.random.normal(key_x, (BATCH, IN_FEATURES)),
        jax.random.normal(key_y, (BATCH, OUT_FEATURES)),
    )


def initial_mlp_params() -> dict[str, jax.Array]:
    key_1, key_2 = jax.random.split(jax.random.key(1))
    return {
        "kernel_1": jax.random.normal(key_1, (IN_FEATURES, HIDDEN)) / IN_FEATURES**0.5,
        "bias_1": jnp.zeros(HIDDEN),
        "kernel_2": jax.random.normal(key_2, (HIDDEN, OUT_FEATURES)) / HIDDEN**0.5,
        "bias_2": jnp.zeros(OUT_FEATURES),
    }


def new_count() -> jax.Array:
    """A hand-written step's step count: statevar's Optimizer counts its steps in
    `statevar.Optimizer.iterations`, so the pure-JAX steps count theirs too (the same
    arithmetic and the same donated buffers on both sides)."""
    return jnp.zeros((), jnp.int32)


# ----------------------------------------------------------------------------- MLP steps
# Each factory returns a function running one training step and returning the loss.


def statevar_step(
    loss_and_grads: Callable, optimizer: statevar.Optimizer
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """A compiled statevar training step: the loss's gradients, then the optimizer's update."""

    @statevar.jit
    def step(x: jax.Array, y: jax.Array) -> jax.Array:
        loss, grads = loss_and_grads(x, y)
        optimizer.apply(grads)
        return loss

    return step


def statevar_mlp_step() -> Callable[[jax.Array, jax.Array], jax.Array]:
    class Dense(statevar.Module):
        def __init__(self, kernel: jax.Array, bias: jax.Array):
            self.kernel = statevar.Variable(kernel)
            self.bias = statevar.Variable(bias)

        def __call__(self, x: jax.Array) -> jax.Array:
            return x @ self.kernel + self.bias

    class MLP(statevar.Module):
        def __init__(self, params: dict[str, jax.Array]):
            self.hidden = Dense(params["kernel_1"], params["bias_1"])
            self.output = Dense(params["kernel_2"], params["bias_2"])

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.output(jax.nn.relu(self.hidden(x)))

    model = MLP(initial_mlp_params())
    optimizer = statevar.Optimizer(optax.sgd(LEARNING_RATE), model)

    def loss_fn(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((model(x) - y) ** 2)

    loss_and_grads = statevar.value_and_grad(loss_fn, model)
    return statevar_step(loss_and_grads, optimizer)


def pure_jax_step(
    tx: optax.GradientTransformation, loss_fn: Callable, params: Any
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """A hand-written training step in pure JAX: one donated ``jax.jit`` of the loss's
    gradient, the optax update and the step count, its state held in a list between calls."""

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def pure_step(params, opt_state, count, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, count + 1, loss

    state = [params, tx.init(params), new_count()]

    def step(x: jax.Array, y: jax.Array) -> jax.Array:
        state[0], state[1], state[2], loss = pure_step(*state, x, y)
        return loss

    return step


def mlp_loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    """The MLP's loss in pure JAX, for the hand-written steps."""
    hidden = jax.nn.relu(x @ params["kernel_1"] + params["bias_1"])
    return jnp.mean((hidden @ params["kernel_2"] + params["bias_2"] - y) ** 2)


def jax_mlp_step() -> Callable[[jax.Array, jax.Array], jax.Array]:
    return pure_jax_step(optax.sgd(LEARNING_RATE), mlp_loss, initial_mlp_params())


def nnx_mlp_step() -> Callable[[jax.Array, jax.Array], jax.Array]:
    class MLP(nnx.Module):
        def __init__(self, params: dict[str, jax.Array]):
            rngs = nnx.Rngs(0)
            self.hidden = nnx.Linear(IN_FEATURES, HIDDEN, rngs=rngs)
            self.output = nnx.Linear(HIDDEN, OUT_FEATURES, rngs=rngs)
            self.hidden.kernel[...], self.hidden.bias[...] = params["kernel_1"], params["bias_1"]
            self.output.kernel[...], self.output.bias[...] = params["kernel_2"], params["bias_2"]

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.output(jax.nn.relu(self.hidden(x)))

    model = MLP(initial_mlp_params())
    optimizer = nnx.Optimizer(model, optax.sgd(LEARNING_RATE), wrt=nnx.Param)

    def loss_fn(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((model(x) - y) ** 2)

    @nnx.jit
    def nnx_step(model: MLP, optimizer: nnx.Optimizer, x: jax.Array, y: jax.Array) -> jax.Array:
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

    return lambda x, y: nnx_step(model, optimizer, x, y)


# ----------------------------------------------------------------------------- 1,000 variables


def initial_vectors() -> list[jax.Array]:
    stacked = jax.random.normal(jax.random.key(2), (NUM_SMALL_VARIABLES, SMALL_SIZE))
    return list(stacked)


def vectors_loss(vectors: list, x: jax.Array) -> jax.Array:
    # A sum of per-vector terms compiles about twice as fast as one over jnp.stack(vectors).
    return sum(jnp.sum((vector * x - 1.0) ** 2) for vector in vectors) / len(vectors)


def statevar_many_step() -> Callable[[jax.Array], jax.Array]:
    class Vectors(statevar.Module):
        def __init__(self, vectors: list[jax.Array]):
            self.vectors = [statevar.Variable(v) for v in vectors]

    model = Vectors(initial_vectors())
    optimizer = statevar.Optimizer(optax.sgd(LEARNING_RATE), model)
    loss_and_grads = statevar.value_and_grad(
        lambda x: vectors_loss([v.value for v in model.vectors], x), model
    )

    @statevar.jit
    def step(x: jax.Array) -> jax.Array:
        loss, grads = loss_and_grads(x)
        optimizer.apply(grads)
        return loss

    return step


def jax_many_step() -> Callable[[jax.Array], jax.Array]:
    tx = optax.sgd(LEARNING_RATE)

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def pure_step(params, opt_state, count, x):
        loss, grads = jax.value_and_grad(vectors_loss)(params, x)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, count + 1, loss

    params = initial_vectors()
    state = [params, tx.init(params), new_count()]

    def step(x: jax.Array) -> jax.Array:
        state[0], state[1], state[2], loss = pure_step(*state, x)
        return loss

    return step


# ----------------------------------------------------------------------------- scan of steps
# SCAN_STEPS MLP steps in one compiled call: ``jax.lax.scan`` over a stack of batches.
SCAN_STEPS = 50


def statevar_scan_step() -> Callable[[jax.Array, jax.Array], jax.Array]:
    one_step = statevar_mlp_step()

    @statevar.jit
    def steps(xs: jax.Array, ys: jax.Array) -> jax.Array:
        return jax.lax.scan(lambda c, batch: (c, one_step(*batch)), None, (xs, ys))[1]

    return steps


def jax_scan_step() -> Callable[[jax.Array, jax.Array], jax.Array]:
    tx = optax.sgd(LEARNING_RATE)

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def pure_steps(params, opt_state, count, xs, ys):
        def one(carry, batch):
            params, opt_state, count = carry
            loss, grads = jax.value_and_grad(mlp_loss)(params, *batch)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state, count + 1), loss

        carry, losses = jax.lax.scan(one, (params, opt_state, count), (xs, ys))
        return *carry, losses

    params = initial_mlp_params()
    state = [params, tx.init(params), new_count()]

    def steps(xs: jax.Array, ys: jax.Array) -> jax.Array:
        state[0], state[1], state[2], losses = pure_steps(*state, xs, ys)
        return losses

    return steps


# ----------------------------------------------------------------------------- transformer
# A stack of pre-norm transformer blocks (self-attention and an MLP, with residuals), adam.
# The three variants share `transformer_loss`, so they run the same arithmetic.
LAYERS, D_MODEL, HEADS, SEQUENCE, TRANSFORMER_BATCH = 2, 128, 4, 64, 8
BLOCK_SHAPES = {
    "norm_1_scale": (D_MODEL,),
    "norm_1_bias": (D_MODEL,),
    "qkv": (D_MODEL, 3 * D_MODEL),
    "out": (D_MODEL, D_MODEL),
    "norm_2_scale": (D_MODEL,),
    "norm_2_bias": (D_MODEL,),
    "up": (D_MODEL, 4 * D_MODEL),
    "up_bias": (4 * D_MODEL,),
    "down": (4 * D_MODEL, D_MODEL),
    "down_bias": (D_MODEL,),
}


def initial_transformer_params() -> list[dict[str, jax.Array]]:
    keys = iter(jax.random.split(jax.random.key(4), LAYERS * len(BLOCK_SHAPES)))
    layers = []
    for _ in range(LAYERS):
        layer = {}
        for name, shape in BLOCK_SHAPES.items():
            key = next(keys)
            if name.endswith("_scale"):
                layer[name] = jnp.ones(shape)
            elif len(shape) == 1:
                layer[name] = jnp.zeros(shape)
            else:
                layer[name] = jax.random.normal(key, shape) / shape[0] ** 0.5
        layers.append(layer)
    return layers


def transformer_batch() -> tuple[jax.Array, jax.Array]:
    key_x, key_y = jax.random.split(jax.random.key(5))
    shape = (TRANSFORMER_BATCH, SEQUENCE, D_MODEL)
    return jax.random.normal(key_x, shape), jax.random.normal(key_y, shape)


def _norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(variance + 1e-6) * scale + bias


def transformer_block(p: Any, x: jax.Array) -> jax.Array:
    """One block; ``p`` maps the names of `BLOCK_SHAPES` to arrays (or Variables)."""
    batch, sequence, _ = x.shape
    h = _norm(x, p["norm_1_scale"], p["norm_1_bias"])
    q, k, v = jnp.split(h @ p["qkv"], 3, axis=-1)
    q, k, v = (t.reshape(batch, sequence, HEADS, D_MODEL // HEADS) for t in (q, k, v))
    attention = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    x = x + attention.reshape(batch, sequence, D_MODEL) @ p["out"]
    h = _norm(x, p["norm_2_scale"], p["norm_2_bias"])
    return x + jax.nn.gelu(h @ p["up"] + p["up_bias"]) @ p["down"] + p["down_bias"]


def transformer_loss(layers: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    for p in layers:
        x = transformer_block(p, x)
    return jnp.mean((x - y) ** 2)


def statevar_transformer_step() -> Callable[[jax.Array, jax.Array], jax.Array]:
    class Block(statevar.Module):
        def __init__(self, params: dict[str, jax.Array]):
            self.params = {name: statevar.Variable(value) for name, value in params.items()}

    class Transformer(statevar.Module):
        def __init__(self, layers: list[dict[str, jax.Array]]):
            self.blocks = [Block(p) for p in layers]

    model = Transformer(initial_transformer_params())
    optimizer = statevar.Optimizer(optax.adam(LEARNING_RATE), model)
    loss_and_grads = statevar.value_and_grad(
        lambda x, y: transformer_loss([b.params for b in model.blocks], x, y), model
    )
    return statevar_step(loss_and_grads, optimizer)


def jax_transformer_step() -> Callable[[jax.Array, jax.Array], jax.Array]:
    tx = optax.adam(LEARNING_RATE)

    return pure_jax_step(tx, transformer_loss, initial_transformer_params())


def nnx_transformer_step() -> Callable[[jax.Array, jax.Array], jax.Array]:
    class Block(nnx.Module):
        def __init__(self, params: dict[str, jax.Array]):
            self.params = nnx.data({name: nnx.Param(value) for name, value in params.items()})

    class Transformer(nnx.Module):
        def __init__(self, layers: list[dict[str, jax.Array]]):
            self.blocks = nnx.List([Block(p) for p in layers])

    model = Transformer(initial_transformer_params())
    optimizer = nnx.Optimizer(model, optax.adam(LEARNING_RATE), wrt=nnx.Param)

    def loss_fn(model: Transformer, x: jax.Array, y: jax.Array) -> jax.Array:
        layers = [{name: p[...] for name, p in b.params.items()} for b in model.blocks]
        return transformer_loss(layers, x, y)

    @nnx.jit
    def nnx_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

    return lambda x, y: nnx_step(model, optimizer, x, y)


# ----------------------------------------------------------------------------- eager Optimizer
NUM_OPTIMIZED = 200


def statevar_eager_apply() -> Callable[[list[jax.Array]], Any]:
    variables = [statevar.Variable(v) for v in initial_vectors()[:NUM_OPTIMIZED]]
    optimizer = statevar.Optimizer(optax.adam(LEARNING_RATE), variables)

    def apply(grads: list[jax.Array]) -> None:
        optimizer.apply(grads)

    apply.wait = lambda: variables[0].value.block_until_ready()  # type: ignore[attr-defined]
    return apply


def jax_donated_apply() -> Callable[[list[jax.Array]], Any]:
    tx = optax.adam(LEARNING_RATE)

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def update(params, opt_state, count, grads):
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, count + 1

    params = initial_vectors()[:NUM_OPTIMIZED]
    state = [params, tx.init(params), new_count()]

    def apply(grads: list[jax.Array]) -> jax.Array:
        state[0], state[1], state[2] = update(*state, grads)
        return state[0][0]

    return apply


# ----------------------------------------------------------------------------- timing


def time_steps(step: Callable, args: tuple, count: int) -> float:
    """Runs ``count`` steps and waits for the last; returns seconds per step."""
    start = time.perf_counter()
    for _ in range(count):
        loss = step(*args)
    wait = getattr(step, "wait", None)
    if wait is not None:  # a step returning nothing says how to wait for it
        wait()
    else:
        loss.block_until_ready()
    return (time.perf_counter() - start) / count


def benchmark(
    variants: dict[str, Callable], args: tuple, rounds: int, steps: int
) -> dict[str, list[float]]:
    """Returns each variant's microseconds per step in every round, interleaving variants."""
    for step in variants.values():  # compile and warm up
        time_steps(step, args, max(steps, 20))
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for order in turns(variants, rounds):
        for name in order:
            samples[name].append(time_steps(variants[name], args, steps))
    return {name: [seconds * 1e6 for seconds in times] for name, times in samples.items()}


def report(title: str, samples: dict[str, list[float]], baseline: str, target: float) -> bool:
    """Prints the medians side by side (and the best round, less exposed to machine load)."""
    medians = {name: statistics.median(micros) for name, micros in samples.items()}
    best = {name: min(micros) for name, micros in samples.items()}
    print(f"\n{title}")
    header = f"{'median us/step':>16}{'vs jax.jit':>12}{'best round':>12}{'vs jax.jit':>12}"
    print(f"  {'variant':<22}{header}")
    for name in samples:
        print(
            f"  {name:<22}{medians[name]:>16.1f}{medians[name] / medians[baseline]:>11.2f}x"
            f"{best[name]:>12.1f}{best[name] / best[baseline]:>11.2f}x"
        )
    ratio = medians["statevar.jit"] / medians[baseline]
    passed = ratio <= target
    verdict = "PASS" if passed else "FAIL"
    print(f"  target statevar.jit <= {target:.2f}x jax.jit (medians): {ratio:.3f}x {verdict}")
    return passed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60, help="timed rounds per model")
    parser.add_argument("--steps-per-round", type=int, default=50, help="steps timed together")
    args = parser.parse_args(argv)

    print(
        f"jax {jax.__version__}, {jax.devices()[0].platform}, {platform.python_version()}; "
        f"{args.rounds} rounds x {args.steps_per_round} steps, median of round means"
    )
    x, y = make_batch()
    mlp = benchmark(
        {
            "statevar.jit": statevar_mlp_step(),
            "jax.jit (donated)": jax_mlp_step(),
            "nnx.jit": nnx_mlp_step(),
        },
        (x, y),
        args.rounds,
        args.steps_per_round,
    )
    small_x = jax.random.normal(jax.random.key(3), (SMALL_SIZE,))
    many = benchmark(
        {"statevar.jit": statevar_many_step(), "jax.jit (donated)": jax_many_step()},
        (small_x,),
        args.rounds,
        args.steps_per_round,
    )
    xs, ys = jnp.stack([x] * SCAN_STEPS), jnp.stack([y] * SCAN_STEPS)
    scan = benchmark(
        {"statevar.jit": statevar_scan_step(), "jax.jit (donated)": jax_scan_step()},
        (xs, ys),
        args.rounds,
        max(1, args.steps_per_round // 10),
    )
    transformer = benchmark(
        {
            "statevar.jit": statevar_transformer_step(),
            "jax.jit (donated)": jax_transformer_step(),
            "nnx.jit": nnx_transformer_step(),
        },
        transformer_batch(),
        args.rounds,
        max(1, args.steps_per_round // 10),
    )
    grads = [jnp.full(SMALL_SIZE, 0.01) for _ in range(NUM_OPTIMIZED)]
    eager = benchmark(
        {"statevar.jit": statevar_eager_apply(), "jax.jit (donated)": jax_donated_apply()},
        (grads,),
        args.rounds,
        args.steps_per_round,
    )
    results = [
        report("MLP 32->64->1, batch 16, sgd", mlp, "jax.jit (donated)", TARGETS["MLP"]),
        report(
            f"lax.scan of {SCAN_STEPS} MLP steps in one call (us per call)",
            scan,
            "jax.jit (donated)",
            TARGETS["scan"],
        ),
        report(
            f"{NUM_SMALL_VARIABLES:,} variables f32[{SMALL_SIZE}], sgd",
            many,
            "jax.jit (donated)",
            TARGETS["1,000 variables"],
        ),
        report(
            f"transformer, {LAYERS} blocks, d_model {D_MODEL}, sequence {SEQUENCE}, "
            f"batch {TRANSFORMER_BATCH}, adam",
            transformer,
            "jax.jit (donated)",
            TARGETS["transformer"],
        ),
        report(
            f"eager Optimizer.apply, {NUM_OPTIMIZED} variables f32[{SMALL_SIZE}], adam "
            "(statevar.jit row: Optimizer.apply outside any jit; jax.jit row: a donated jit "
            "of the optax update)",
            eager,
            "jax.jit (donated)",
            TARGETS["eager Optimizer.apply"],
        ),
    ]
    print(f"\n{'PASS' if all(results) else 'FAIL'}: {sum(results)} of {len(results)} targets met")


if __name__ == "__main__":
    main()
