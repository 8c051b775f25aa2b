"""On-read variables (``synchronization="on_read"``): one value per replica along the mesh's
first axis, read as their aggregate; `statevar.PerReplica` updates with no collective;
cross-replica updates that set the aggregate exactly; `statevar.jit`, `statevar.grad`,
checkpoints onto any replica count, and the errors. conftest gives eight CPU devices; the
mesh tests run on an Auto and on an Explicit mesh."""

from __future__ import annotations

import copy
import enum
import io
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import statevar
from statevar._cell import kernels as _kernels
from statevar._distribute import on_read as _on_read

COLLECTIVES = ("all-reduce", "all-gather", "collective-permute", "all-to-all", "reduce-scatter")


@pytest.fixture(params=[AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
def mesh(request):
    """A 4 x 2 mesh of the eight CPU devices: four replicas along "data"."""
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(request.param,) * 2)


def on_read(value, aggregation, mesh, **kwargs):
    with statevar.mesh(mesh):
        return statevar.Variable(
            value, synchronization="on_read", aggregation=aggregation, **kwargs
        )


def collectives(compiled_text):
    return [name for name in COLLECTIVES if name in compiled_text]


# ----------------------------------------------------------------------- reads


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [("sum", [10.0, 14.0]), ("mean", [2.5, 3.5]), ("only_first_replica", [1.0, 2.0])],
)
def test_every_read_gives_the_aggregate(mesh, aggregation, expected):
    v = on_read(jnp.zeros(2), aggregation, mesh, name="v")
    v.assign(statevar.PerReplica(jnp.array([[1.0, 2.0], [2.0, 3.0], [3.0, 4.0], [4.0, 5.0]])))
    expected = np.array(expected, np.float32)

    chex.assert_trees_all_close(v.value, expected)
    chex.assert_trees_all_close(v.read_value(), expected)
    chex.assert_trees_all_close(v.numpy(), expected)
    chex.assert_trees_all_close(np.asarray(v), expected)
    chex.assert_trees_all_close(v + 1, expected + 1)
    chex.assert_trees_all_close(jnp.sin(v), np.sin(expected))  # pytree, as a Variable
    chex.assert_trees_all_close(jnp.asarray(v), expected)  # __jax_array__
    chex.assert_trees_all_close(v[1], expected[1])
    chex.assert_trees_all_close(jax.jit(lambda x: x * 2)(v), expected * 2)
    chex.assert_trees_all_close(statevar.jit(lambda: v * 2)(), expected * 2)
    assert v.shape == (2,) and v.ndim == 1 and v.size == 2 and len(v) == 2
    assert v.value.sharding.is_equivalent_to(v.sharding, 1)


def test_replica_values_hold_one_value_per_replica_on_its_own_devices(mesh):
    v = on_read(jnp.zeros((3, 2)), "sum", mesh, name="v")

    replicas = v.replica_values
    chex.assert_shape(replicas, (4, 3, 2))
    assert v.replicas == 4
    assert replicas.sharding.spec == P("data")
    for shard in replicas.addressable_shards:
        row = int(np.argwhere(mesh.devices == shard.device)[0][0])
        assert shard.index[0] == slice(row, row + 1)  # replica i lives on mesh row i
    assert v.sharding == NamedSharding(mesh, P())
    assert v.trainable is False
    assert (v.synchronization, v.aggregation) == ("on_read", "sum")


def test_the_value_may_be_sharded_over_the_mesh_other_axes(mesh):
    v = on_read(jnp.zeros((4, 6)), "mean", mesh, name="v", sharding=(None, "model"))
    v.assign(statevar.PerReplica(jnp.arange(4.0)))

    assert v.sharding.spec == P(None, "model")
    assert v.replica_values.sharding.spec == P("data", None, "model")
    chex.assert_trees_all_close(v.numpy(), np.full((4, 6), 1.5, np.float32))


# ----------------------------------------------------------------------- per-replica updates


@pytest.mark.parametrize("aggregation", ["sum", "mean", "only_first_replica"])
def test_per_replica_updates_change_each_replica_on_its_own(mesh, aggregation):
    v = on_read(jnp.zeros(3), aggregation, mesh, name="v")
    start = np.arange(12.0, dtype=np.float32).reshape(4, 3)

    v.assign(statevar.PerReplica(start))
    chex.assert_trees_all_close(v.replica_values, start)
    v.assign_add(statevar.PerReplica([1.0, 2.0, 3.0, 4.0]))  # one scalar per replica
    v.assign_sub(statevar.PerReplica(jnp.ones((4, 3))))

    expected = start + np.array([[0.0], [1.0], [2.0], [3.0]], np.float32)
    chex.assert_trees_all_close(v.replica_values, expected)
    assert v.replica_values.sharding.spec == P("data")


def test_a_per_replica_update_has_no_collective_and_runs_in_place(mesh):
    v = on_read(jnp.zeros(3), "sum", mesh, name="v")
    deltas = jax.device_put(jnp.ones((4, 3)), v.replica_values.sharding)
    v.assign_add(statevar.PerReplica(deltas))  # compiled and warm
    buffers = [s.data.unsafe_buffer_pointer() for s in v.replica_values.addressable_shards]

    v.assign_add(statevar.PerReplica(deltas))

    assert [s.data.unsafe_buffer_pointer() for s in v.replica_values.addressable_shards] == (
        buffers
    )
    donating, _ = _on_read.local_updates(_kernels.ASSIGN_ADD, v._layout)
    update = donating.lower(v.replica_values, deltas).compile().as_text()
    assert collectives(update) == []
    # The read is where the replicas communicate: the check above can fail.
    assert "all-reduce" in collectives(
        _on_read.reader(v._layout).lower(v.replica_values).compile().as_text()
    )
    chex.assert_trees_all_close(v.numpy(), np.full(3, 8.0, np.float32))


def test_a_per_replica_update_inside_statevar_jit_has_no_collective(mesh):
    v = on_read(jnp.zeros(3), "sum", mesh, name="v")

    @statevar.jit
    def count(deltas):
        v.assign_add(statevar.PerReplica(deltas))

    deltas = jax.device_put(jnp.ones((4, 3)), NamedSharding(mesh, P("data")))
    assert collectives(count.lower(deltas).compile().as_text()) == []
    count(deltas)
    count(deltas)

    chex.assert_trees_all_close(v.replica_values, np.full((4, 3), 2.0, np.float32))
    chex.assert_trees_all_close(v.numpy(), np.full(3, 8.0, np.float32))


def test_per_replica_values_from_a_sequence_of_arrays_on_any_device(mesh):
    v = on_read(0, "sum", mesh, name="v")
    parts = [jax.device_put(jnp.int32(i), jax.devices()[7 - i]) for i in range(4)]

    v.assign(statevar.PerReplica(parts))

    chex.assert_trees_all_close(v.replica_values, np.arange(4, dtype=np.int32))
    assert int(v) == 6


# ----------------------------------------------------------------------- cross-replica updates


@pytest.mark.parametrize(
    ("aggregation", "replicas"),
    [
        ("sum", [[0.1, 0.2], [0.0, 0.0], [0.0, 0.0]]),
        ("mean", [[0.1, 0.2]] * 3),
        ("only_first_replica", [[0.1, 0.2]] * 3),
    ],
)
def test_a_cross_replica_assign_sets_the_aggregate_exactly(aggregation, replicas):
    # Three replicas: a mean of three equal values, summed then divided, could round.
    three = jax.make_mesh((3,), ("data",), devices=jax.devices()[:3])
    v = on_read(jnp.zeros(2), aggregation, three, name="v")
    v.assign_add(statevar.PerReplica([[1.0, 1.0], [5.0, 0.5], [0.3, 7.0]]))

    v.assign(np.array([0.1, 0.2], np.float32))

    np.testing.assert_array_equal(v.numpy(), np.array([0.1, 0.2], np.float32))
    np.testing.assert_array_equal(v.replica_values, np.array(replicas, np.float32))


@pytest.mark.parametrize("aggregation", ["sum", "mean", "only_first_replica"])
def test_cross_replica_add_and_sub_change_the_aggregate_by_the_delta(mesh, aggregation):
    v = on_read(jnp.zeros(2), aggregation, mesh, name="v")
    v.assign(statevar.PerReplica(jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])))
    before = v.numpy()

    v.assign_add([10.0, 20.0])
    chex.assert_trees_all_close(v.numpy(), before + np.array([10.0, 20.0], np.float32))
    v.assign_sub(2.0)
    chex.assert_trees_all_close(v.numpy(), before + np.array([8.0, 18.0], np.float32))
    if aggregation == "sum":  # the first replica takes the delta, as TensorFlow does
        chex.assert_trees_all_close(
            np.asarray(v.replica_values)[1:], np.array([[3, 4], [5, 6], [7, 8.0]])
        )


@pytest.mark.parametrize("aggregation", ["sum", "mean", "only_first_replica"])
def test_setting_an_item_sets_the_aggregate_item(mesh, aggregation):
    v = on_read(
        jnp.zeros(4, jnp.int32) if aggregation == "sum" else jnp.zeros(4), aggregation, mesh
    )
    v.assign(statevar.PerReplica(jnp.ones((4, 4), v.dtype)))
    before = v.numpy()

    v[1] = 9
    v[v.value > 100] = 0  # a mask: nothing selected
    v[jnp.array([2, 3])] = jnp.array([5, 6], v.dtype)

    expected = before.copy()
    expected[1:] = [9, 5, 6]
    chex.assert_trees_all_close(v.numpy(), expected)


def test_an_update_inside_statevar_jit_matches_the_eager_update(mesh):
    eager, compiled = (on_read(jnp.zeros(2), "sum", mesh, name=n) for n in ("e", "c"))

    def step(batch):
        variable = compiled if not eager_mode[0] else eager
        variable.assign_add(statevar.PerReplica(batch))
        variable.assign_add(1.0)
        total = variable.value * 1  # a read inside the step gives the aggregate
        variable.assign(total)
        return total

    eager_mode = [True]
    batch = jnp.arange(8.0).reshape(4, 2)
    expected = step(batch)
    eager_mode[0] = False
    result = statevar.jit(step)(batch)

    chex.assert_trees_all_close(result, expected)
    chex.assert_trees_all_close(compiled.replica_values, eager.replica_values)
    chex.assert_trees_all_close(compiled.numpy(), np.array([13.0, 17.0], np.float32))


def test_data_parallel_counters_sum_what_each_replica_saw(mesh):
    """Metrics as TensorFlow keeps them with ON_READ: each replica counts its own examples
    and adds its own loss; reading gives the totals."""
    examples = on_read(0, "sum", mesh, name="metrics/examples")
    loss_sum = on_read(0.0, "sum", mesh, name="metrics/loss_sum")
    data = NamedSharding(mesh, P("data"))

    @statevar.jit
    def evaluate(x, valid):
        losses = (x**2).sum(axis=1) * valid  # per example, sharded over the replicas
        per_replica = losses.reshape(4, -1).sum(axis=1)  # each replica's own sum
        examples.assign_add(statevar.PerReplica(valid.reshape(4, -1).sum(axis=1)))
        loss_sum.assign_add(statevar.PerReplica(per_replica))

    x = jax.device_put(jnp.arange(32.0).reshape(16, 2) / 10, data)
    valid = jax.device_put(jnp.array([1] * 13 + [0] * 3, jnp.int32), data)
    for _ in range(3):
        evaluate(x, valid)
    jax.block_until_ready(examples.replica_values)

    assert int(examples) == 39
    np.testing.assert_array_equal(examples.replica_values, [12, 12, 12, 3])
    expected = 3 * float(((np.asarray(x) ** 2).sum(axis=1) * np.asarray(valid)).sum())
    assert float(loss_sum) == pytest.approx(expected, rel=1e-6)
    chex.assert_trees_all_close(loss_sum / examples, expected / 39, rtol=1e-6)


def test_grad_and_stateless_call_see_the_aggregate(mesh):
    with statevar.mesh(mesh):  # replicated over the mesh, as the replicas' aggregate
        w = statevar.Variable(2.0, name="w")
    seen = on_read(0.0, "mean", mesh, name="seen")
    seen.assign(statevar.PerReplica([1.0, 2.0, 3.0, 6.0]))

    def loss():
        seen.assign_add(1.0)
        return w * seen

    with jax.set_mesh(mesh):  # eager JAX on an Explicit mesh asks for it
        value, grad = statevar.value_and_grad(loss, w)()
    assert (float(value), float(grad), float(seen)) == (8.0, 4.0, 4.0)
    values = statevar.read_values([seen])
    result, new = statevar.stateless_call(lambda: seen.assign_add(1.0).value, [seen], values)
    assert (float(result), float(new[0]), float(seen)) == (5.0, 5.0, 4.0)


def test_writes_under_nested_transformations_inside_statevar_jit(mesh):
    with statevar.mesh(mesh):
        w = statevar.Variable(2.0, name="w")
    seen = on_read(0.0, "sum", mesh, name="seen")

    def count(deltas):
        seen.assign_add(statevar.PerReplica(deltas))

    def loss():
        seen.assign_add(1.0)
        return w * seen

    @statevar.jit
    def step(flag, deltas):
        jax.lax.cond(flag, count, lambda deltas: None, deltas)
        return statevar.grad(loss, w)()

    grads = [float(step(flag, jnp.ones(4))) for flag in (True, False)]

    assert grads == [5.0, 6.0]
    assert float(seen) == 6.0


# ----------------------------------------------------------------------- checkpoints


def test_a_checkpoint_holds_the_aggregate_and_restores_onto_any_replica_count(mesh, tmp_path):
    v = on_read(jnp.zeros(2), "sum", mesh, name="v")
    v.assign(statevar.PerReplica(jnp.arange(8.0).reshape(4, 2)))
    statevar.save(tmp_path / "ckpt", [v])

    two = jax.make_mesh((2,), ("replica",), devices=jax.devices()[4:6])
    fewer = on_read(jnp.zeros(2), "sum", two, name="v")
    plain = statevar.Variable(jnp.zeros(2), name="v")
    statevar.restore(tmp_path / "ckpt", [fewer])
    statevar.restore(tmp_path / "ckpt", [plain])

    expected = np.array([12.0, 16.0], np.float32)
    chex.assert_trees_all_close(fewer.numpy(), expected)
    chex.assert_trees_all_close(fewer.replica_values, np.array([[12.0, 16.0], [0.0, 0.0]]))
    chex.assert_trees_all_close(plain.numpy(), expected)

    statevar.save(tmp_path / "plain", [statevar.Variable([1.0, 3.0], name="v")])
    statevar.restore(tmp_path / "plain", [v])
    chex.assert_trees_all_close(v.numpy(), np.array([1.0, 3.0], np.float32))


def test_checkpoint_manager_restores_an_on_read_variable(mesh, tmp_path):
    v = on_read(0, "sum", mesh, name="count")
    v.assign_add(statevar.PerReplica([1, 2, 3, 4]))
    manager = statevar.CheckpointManager(tmp_path / "run")
    manager.save(1, [v])
    v.assign(0)

    manager.restore([v])

    assert int(v) == 10


# ----------------------------------------------------------------------- variable protocols


def test_repr_and_summary_say_it_is_on_read(mesh):
    class Metrics(statevar.Module):
        def __init__(self):
            self.total = on_read(jnp.zeros(2), "sum", mesh)

    metrics = Metrics()
    metrics.total.assign(statevar.PerReplica(jnp.ones((4, 2))))
    out = io.StringIO()
    statevar.summary(metrics, file=out)

    assert repr(metrics.total) == (
        "<Variable 'total' shape=(2,) dtype=float32, on_read aggregation='sum' replicas=4, "
        "numpy=array([4., 4.], dtype=float32)>"
    )
    assert "on_read sum x4 P('data',)" in out.getvalue()
    assert "synchronization='on_read', aggregation='sum'" in repr(metrics)


def test_copies_keep_their_own_replicas(mesh):
    v = on_read(jnp.zeros(2), "mean", mesh, name="v")
    v.assign(statevar.PerReplica(jnp.arange(8.0).reshape(4, 2)))

    copied = copy.deepcopy(v)
    copied.assign_add(statevar.PerReplica(jnp.ones((4, 2))))
    from_variable = statevar.Variable(v)  # a plain variable of its value

    chex.assert_trees_all_close(v.replica_values, np.arange(8.0).reshape(4, 2))
    chex.assert_trees_all_close(copied.replica_values, np.arange(8.0).reshape(4, 2) + 1)
    assert copied.synchronization == "on_read" and copied.replicas == 4
    assert from_variable.synchronization == "auto"
    chex.assert_trees_all_close(from_variable.numpy(), v.numpy())
    view = jax.tree.map(lambda x: x, v)
    chex.assert_trees_all_close(view.value, v.value)


def test_reshard_moves_the_aggregate_onto_another_mesh(mesh):
    v = on_read(jnp.zeros(2), "sum", mesh, name="v")
    v.assign(statevar.PerReplica(jnp.arange(8.0).reshape(4, 2)))
    two = jax.make_mesh((2,), ("replica",), devices=jax.devices()[:2])

    v.reshard(NamedSharding(two, P()))

    assert v.replicas == 2
    chex.assert_trees_all_close(v.numpy(), np.array([12.0, 16.0], np.float32))
    chex.assert_trees_all_close(v.replica_values, np.array([[12.0, 16.0], [0.0, 0.0]]))


def test_statevar_reshard_checks_every_spec_before_moving_anything(mesh):
    class Model(statevar.Module):
        def __init__(self):
            self.kernel = statevar.Variable(jnp.ones((4, 2)))
            self.count = on_read(jnp.zeros(4), "sum", mesh)

    model = Model()
    before = model.kernel.sharding
    with pytest.raises(
        statevar.PlacementError,
        match="Cannot reshard Variable 'count' with synchronization='on_read' and sharding "
        "P.'data',.: mesh axis 'data', the mesh's first, holds the replicas",
    ):
        statevar.reshard(model, [("", P("data"))], mesh=mesh)
    assert model.kernel.sharding == before

    placed = statevar.reshard(model, [("kernel", P("data"))], mesh=mesh)
    assert placed["count"] == NamedSharding(mesh, P()) and model.count.replicas == 4


def test_an_assign_restores_a_variable_deleted_outside_statevar(mesh):
    v = on_read(jnp.zeros(2), "sum", mesh, name="v")
    v.replica_values.delete()

    with pytest.raises(ValueError, match="Cannot assign_add to Variable 'v': its array was"):
        v.assign_add(1.0)
    v.assign([1.0, 2.0])
    chex.assert_trees_all_close(v.numpy(), np.array([1.0, 2.0], np.float32))
    v.replica_values.delete()
    v.assign(statevar.PerReplica(jnp.ones((4, 2))))
    chex.assert_trees_all_close(v.numpy(), np.array([4.0, 4.0], np.float32))


def test_updates_never_take_the_eager_hot_path(mesh):
    v = on_read(0.0, "sum", mesh, name="v")
    for _ in range(3):
        v.assign_add(jnp.float32(1.0))

    assert v._hot_avals == [None, None, None]  # the eager hot path stays closed
    assert float(v) == 3.0


class Synchronization(enum.Enum):  # spelled as TensorFlow's enums are
    ON_READ = 3


class Aggregation(enum.Enum):
    ONLY_FIRST_REPLICA = 3


def test_tensorflow_spellings_and_the_defaults():
    mesh = jax.make_mesh((8,), ("data",))
    v = statevar.Variable(
        1.0,
        synchronization=Synchronization.ON_READ,
        aggregation=Aggregation.ONLY_FIRST_REPLICA,
        sharding=NamedSharding(mesh, P()),
    )
    assert (v.synchronization, v.aggregation, v.replicas) == ("on_read", "only_first_replica", 8)
    plain = statevar.Variable(1.0, synchronization="ON_WRITE", aggregation="sum")
    assert (plain.synchronization, plain.aggregation, plain.trainable) == ("on_write", "sum", True)
    default = statevar.Variable(1.0)
    assert (default.synchronization, default.aggregation) == ("auto", "none")
    assert statevar.Variable(1.0, synchronization=None).synchronization == "auto"


# ----------------------------------------------------------------------- errors


def test_an_on_read_variable_cannot_be_trainable(mesh):
    with pytest.raises(
        ValueError, match="Variable 'v' with synchronization='on_read' and trainable=True"
    ):
        on_read(0.0, "sum", mesh, name="v", trainable=True)
    v = on_read(0.0, "sum", mesh, name="v")
    with pytest.raises(ValueError, match="Cannot make Variable 'v' trainable"):
        v.trainable = True
    v.trainable = False
    assert v.trainable is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(synchronization="on_reed"),
            "Variable 'v' with synchronization='on_reed': expected one of 'auto', 'on_write', "
            "'on_read'",
        ),
        (
            dict(synchronization="on_read", aggregation="max"),
            "Variable 'v' with aggregation='max': expected one of 'none', 'sum', 'mean', "
            "'only_first_replica'",
        ),
        (dict(aggregation=3), "Variable 'v' with aggregation=3: expected one of"),
        (
            dict(synchronization="on_read"),
            "Variable 'v' with synchronization='on_read' and no aggregation: expected "
            "aggregation='sum', 'mean' or 'only_first_replica'",
        ),
    ],
)
def test_unknown_settings_are_refused(mesh, kwargs, message):
    with statevar.mesh(mesh), pytest.raises(ValueError, match=re.escape(message)):
        statevar.Variable(0.0, name="v", **kwargs)


def test_an_on_read_variable_needs_a_mesh(mesh):
    with pytest.raises(
        statevar.PlacementError,
        match="Variable 'v' with synchronization='on_read': it needs a device mesh",
    ):
        statevar.Variable(0.0, synchronization="on_read", aggregation="sum", name="v")
    with (
        statevar.mesh(mesh),
        pytest.raises(statevar.PlacementError, match="got none .it would be placed on cpu:1"),
    ):
        statevar.Variable(
            0.0, synchronization="on_read", aggregation="sum", name="v", device="cpu:1"
        )
    with pytest.raises(
        statevar.PlacementError, match="mesh axis 'data', the mesh's first, holds the replicas"
    ):
        on_read(jnp.zeros(4), "sum", mesh, name="v", sharding=("data",))


def test_a_dtype_its_aggregation_cannot_combine_is_refused(mesh):
    with pytest.raises(TypeError, match="Variable 'v' with aggregation='mean' and dtype int32"):
        on_read(0, "mean", mesh, name="v")
    with pytest.raises(TypeError, match="Variable 'v' with aggregation='sum' and dtype bool"):
        on_read(False, "sum", mesh, name="v")
    flag = on_read(False, "only_first_replica", mesh, name="flag")
    flag.assign(statevar.PerReplica([True, False, False, False]))
    assert bool(flag) is True
    with pytest.raises(TypeError, match="Cannot assign_add to Variable 'flag': it has dtype bool"):
        flag.assign_add(True)


def test_a_subclass_cannot_be_on_read(mesh):
    class Mine(statevar.Variable):
        pass

    with pytest.raises(
        ValueError, match="Variable 'v' of the subclass Mine with synchronization='on_read'"
    ):
        Mine(0.0, synchronization="on_read", aggregation="sum", name="v")


@pytest.mark.parametrize(
    ("update", "error", "message"),
    [
        (
            lambda v: v.assign(statevar.PerReplica(jnp.ones((3, 2)))),
            ValueError,
            "Cannot assign to Variable 'v': statevar.PerReplica has 3 values, but the variable "
            "has 4 replicas (mesh axis 'data')",
        ),
        (
            lambda v: v.assign_add(statevar.PerReplica(jnp.ones((4, 3)))),
            ValueError,
            "Cannot assign_add to Variable 'v': each replica's value in statevar.PerReplica "
            "has shape (3,), which does not broadcast to the variable's shape (2,)",
        ),
        (
            lambda v: v.assign_sub(statevar.PerReplica([1.0, [1.0, 2.0], 3.0, 4.0])),
            ValueError,
            "Cannot assign_sub to Variable 'v': the statevar.PerReplica values have different "
            "shapes",
        ),
        (
            lambda v: v.assign(statevar.PerReplica(jnp.ones((4, 2), jnp.complex64))),
            TypeError,
            "Cannot assign to Variable 'v': a value of dtype complex64 cannot be converted "
            "safely to the variable's dtype float32",
        ),
        (
            lambda v: v.__setitem__(0, statevar.PerReplica(jnp.ones(4))),
            TypeError,
            "Cannot set an item of Variable 'v' with statevar.PerReplica values",
        ),
        (
            lambda v: v.assign(jnp.ones(3)),
            ValueError,
            "Cannot assign to Variable 'v': shape (3,) does not match the variable's shape (2,)",
        ),
        (
            lambda v: v.reshard(jax.devices()[0]),
            ValueError,
            "Cannot reshard Variable 'v' with synchronization='on_read': it needs a device mesh",
        ),
    ],
)
def test_a_refused_update_leaves_the_variable_as_it_was(mesh, update, error, message):
    v = on_read(jnp.zeros(2), "sum", mesh, name="v")
    v.assign(statevar.PerReplica(jnp.arange(8.0).reshape(4, 2)))
    before = np.asarray(v.replica_values)

    with pytest.raises(error, match=re.escape(message)):
        update(v)

    np.testing.assert_array_equal(v.replica_values, before)
    assert v.replicas == 4


def test_a_per_replica_update_inside_statevar_jit_checks_the_replica_count(mesh):
    v = on_read(jnp.zeros(2), "sum", mesh, name="v")

    @statevar.jit
    def step(deltas):
        v.assign_add(statevar.PerReplica(deltas))

    with pytest.raises(
        ValueError, match="statevar.PerReplica has 8 values, but the variable has 4"
    ):
        step(jnp.ones((8, 2)))
    with pytest.raises(statevar.TraceContextError, match="Cannot reshard Variable 'v' inside"):
        statevar.jit(lambda: v.reshard(v.sharding))()
    chex.assert_trees_all_close(v.replica_values, np.zeros((4, 2), np.float32))


@pytest.mark.parametrize(
    ("values", "error", "message"),
    [
        ([], ValueError, "Expected statevar.PerReplica to get one value per replica, got none"),
        (np.float32(1.0), TypeError, "got float32"),
        (jnp.float32(1.0), ValueError, "got a scalar float32 array"),
        ("abc", TypeError, "got str"),
    ],
)
def test_per_replica_refuses_what_is_not_per_replica_values(values, error, message):
    with pytest.raises(error, match=re.escape(message)):
        statevar.PerReplica(values)


def test_per_replica_is_a_pytree():
    values = statevar.PerReplica([jnp.ones(2), jnp.zeros(2)])
    doubled = jax.tree.map(lambda x: x * 2, values)
    assert len(doubled) == 2 and repr(doubled) == "PerReplica(2 values)"
    chex.assert_trees_all_close(doubled.values[0], np.full(2, 2.0, np.float32))
    assert repr(statevar.PerReplica(jnp.ones((4, 3)))) == "PerReplica(float32[4, 3])"
    assert statevar.PerReplica(values).values is values.values


def test_a_kept_copy_error_holds_no_replica_array(mesh):
    # The refused update's frames hold the old array: a kept error must not keep them.
    v = on_read(jnp.zeros(2), "sum", mesh, name="v")
    v.assign_add(jnp.ones(2))
    read = v.replica_values
    with statevar.copy_policy("raise"):
        try:
            v.assign_add(jnp.ones(2))
        except statevar.CopyError as error:
            kept = error
        del read
        v.assign_add(jnp.ones(2))  # nothing holds the array now: donated
    assert "Variable 'v'" in str(kept)
