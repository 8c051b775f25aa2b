"""`Optimizer`: an optax gradient transformation that updates variables in place."""

from __future__ import annotations

import contextlib
import copy
import warnings
import weakref
from collections.abc import Iterable
from typing import Any, cast

import jax
import jax.numpy as jnp
import optax

from .._cell.creation import constrained
from .._cell.indexing import read_operand
from .._cell.placement import is_multi_device, replicated
from .._cell.tree import (
    Node,
    Structure,
    is_differentiable,
    is_variable,
    iter_variables,
    not_a_variable,
    variable_tree,
    variables_and_structure,
)
from .._cell.variable import Variable
from .._compile.jit import jit
from .._errors import caller_stacklevel
from .._state import STATE
from .._tracing import frames as _frames
from .optimizer_state import (
    check_gradient_dtype,
    check_gradient_shape,
    find_learning_rate,
    home_of,
    is_key,
    placed_gradient,
    state_layout,
    state_names,
    state_placements,
    transformation,
    unique,
)
from .pytree import gradients_by_name, register_optimizer


class Optimizer:
    """Applies an `optax.GradientTransformation` to variables, in place, as Keras's do.

    The optimizer's state (moments, step counts, an injected learning rate) lives in
    non-trainable Variables named after their parameters (``optimizer/mu/layers/0/kernel``),
    so it is donated and updated in place like the parameters, and saved with them (an
    Optimizer is itself a checkpoint target). `apply_gradients` takes ``zip(grads,
    variables)`` for any subset of the variables, as ``tf.keras`` optimizers do; `apply`
    takes gradients shaped like `statevar.grad` returns them. Both work eagerly (as one
    compiled, donating call) and inside `statevar.jit`.

    Given no variables, the Optimizer is built by its first `apply_gradients` (or by
    `build`): eagerly, or in a `statevar.jit` step's first trace, as Keras's optimizer
    builds in a ``tf.function``.

    Args:
      tx: the optax transformation, e.g. ``optax.adam(1e-3)``; or a factory such as
        ``optax.adam`` with its hyperparameters as keywords, which are injected with
        ``optax.inject_hyperparams`` so that `learning_rate` can be read and set.
      variables: a Variable, a Module, or a list, tuple or dict of them; the trainable,
        floating-point ones are optimized. Gradients passed to `apply` mirror this
        structure, as `statevar.grad` gives them for the same ``wrt``. None: build later.
      name: the prefix of the state variables' names (``"optimizer/iterations"``, ...).
      **hyperparameters: the factory's arguments, e.g. ``learning_rate=1e-3``; and
        ``hyperparam_dtype``, the dtype they are held in: float32 unless given, so that in
        a bfloat16 model adam's ``b2=0.999`` does not round to 1.

    Raises:
      TypeError: if ``tx`` is not an optax transformation (or a factory with
        hyperparameters), ``variables`` holds anything but Variables and Modules, or
        ``name`` is not a str.

    Example:
      >>> import optax, statevar
      >>> w = statevar.Variable([1.0, 2.0], name="w")
      >>> opt = statevar.Optimizer(optax.sgd, learning_rate=0.5)
      >>> opt.apply_gradients(zip([w.value], [w]))  # builds the state for w
      >>> w
      <Variable 'w' shape=(2,) dtype=float32, numpy=array([0.5, 1. ], dtype=float32)>
      >>> opt.learning_rate = 0.25
      >>> opt.apply_gradients([(w.value, w)])
      >>> w.numpy(), int(opt.iterations)
      (array([0.375, 0.75 ], dtype=float32), 2)
    """

    def __init__(
        self,
        tx: Any,
        variables: Any = None,
        *,
        name: str = "optimizer",
        **hyperparameters: Any,
    ):
        if not isinstance(name, str):
            raise TypeError(f"Expected the Optimizer's name to be a str, got {type(name).__name__}")
        self._tx = transformation(tx, hyperparameters)
        self._name = name
        self._iterations = Variable(0, trainable=False, name=f"{name}/iterations")
        self._built = False
        self._leaves: tuple[Variable, ...] = ()
        self._treedef: Any = None
        self._params: tuple[Variable, ...] = ()
        self._param_names: tuple[str, ...] = ()
        self._state: tuple[Variable, ...] = ()
        self._state_names: tuple[str, ...] = ()
        self._state_owners: tuple[int | None, ...] = ()
        self._state_key_impls: tuple[Any, ...] = ()
        self._learning_rate: tuple[Variable | None, bool] = (None, False)
        self._full_structure: Any = None
        self._sequence_type: type | None = None
        self._keys: tuple[Any, ...] | None = None
        self._array_types: frozenset[type] = frozenset()
        self._spread = False
        # The Module the Optimizer was built for (weakly) and how its variables were found:
        # `apply` refuses to update variables the Module no longer holds.
        self._module: tuple[weakref.ref[Node], Structure] | None = None
        # The variables `apply` has warned about getting no gradient for.
        self._warned_no_gradient: set[Variable] = set()
        self._compiled_apply = jit(self._apply_traced)
        # Placement errors name the Optimizer, not its inner function.
        cast(Any, self._compiled_apply).subject = f"Optimizer {name!r}, applying gradients,"
        if variables is not None:
            self.build(variables)

    # ----------------------------------------------------------------- building

    def build(self, variables: Any) -> None:
        """Creates the optimizer's state for ``variables``, as Keras's ``build(var_list)``.

        Args:
          variables: a Variable, a Module, or a list, tuple or dict of them; the trainable,
            floating-point ones are optimized, and `apply` takes gradients mirroring this.

        Raises:
          ValueError: if the Optimizer is already built.
          TypeError: if ``variables`` holds anything but Variables and Modules.
          TraceContextError: where its state variables cannot be created: inside
            `statevar.grad`, or a `statevar.jit` step after its first trace (see
            `statevar.jit`).
        """
        if self._built:
            raise ValueError(
                f"Optimizer '{self._name}' is already built, for {len(self._params)} "
                "variables; create another Optimizer for other variables"
            )
        tree = variable_tree(variables, "the Optimizer's variables")
        # In a compiled step's first trace, as Keras's optimizer builds in tf.function's: from
        # the variables' values at the start of the step, computed then (concrete).
        creating = _frames.check_creation(f"the state of Optimizer '{self._name}'") is not None
        with jax.ensure_compile_time_eval() if creating else contextlib.nullcontext():
            self._build(tree, variables, creating)

    def _build(self, tree: Any, variables: Any, creating: bool) -> None:
        """`build`, once checked; ``creating``: in a compiled step's first trace."""
        leaves, self._treedef = jax.tree.flatten(tree, is_leaf=is_variable)
        self._leaves = tuple(leaves)
        self._watch(variables)
        self._params = tuple(dict.fromkeys(v for v in leaves if is_differentiable(v)))
        first_name: dict[Variable, str] = {}
        for name, variable in iter_variables(variables, "the Optimizer's variables"):
            first_name.setdefault(variable, name)
        self._param_names = tuple(unique([first_name[v] for v in self._params]))
        values = [v._value if creating else v.value for v in self._params]
        state = self._tx.init(dict(zip(self._param_names, values, strict=True)))
        layout = state_layout(state, self._param_names)
        index = {name: i for i, name in enumerate(self._param_names)}
        self._state_owners = tuple(None if o is None else index[o] for _, o, _ in layout)
        self._state_names = tuple(state_names(layout))
        leaves, self._state_treedef = jax.tree.flatten(state)
        placements = state_placements(self._params, self._state_owners, leaves)
        # A typed PRNG key in the state (optax.noisy_sgd's) is held as its key data, and
        # made a key again for the transformation.
        self._state_key_impls = tuple(
            jax.random.key_impl(leaf) if is_key(leaf) else None for leaf in leaves
        )
        self._state = tuple(
            Variable(
                jax.random.key_data(leaf) if is_key(leaf) else leaf,
                trainable=False,
                name=f"{self._name}/{name}",
                device=placement,
            )
            for name, leaf, placement in zip(self._state_names, leaves, placements, strict=True)
        )
        spread = [p.sharding for p in self._params if is_multi_device(p.sharding)]
        home = replicated(spread[0]) if spread else home_of(self._params)
        if home is not None and self._iterations.sharding.device_set != home.device_set:
            self._iterations.reshard(home)
        self._learning_rate = find_learning_rate(layout, self._state)
        # The structure of gradients with every optimized variable's slot filled: `apply`
        # checks such gradients in one pass. None when a variable occurs twice.
        params = set(self._params)
        slots = [v for v in self._leaves if v in params]
        self._full_structure = (
            jax.tree.structure(
                self._treedef.unflatten([0 if v in params else None for v in self._leaves])
            )
            if slots == list(self._params)
            else None
        )
        # A list or tuple of exactly the optimized variables: gradients of the same type
        # and length are checked without flattening them (`apply`).
        # (The parameters are the leaves that are optimized, once each, in order: as many
        # only when they are all the leaves.)
        sequence = type(tree) in (list, tuple) and len(self._leaves) == len(self._params)
        self._sequence_type = type(tree) if sequence and self._full_structure is not None else None
        # A dict of exactly the optimized variables (a Module's, by path), each once: gradients
        # in a dict (as `statevar.grad` returns a Module's) are read by its keys, in the
        # order JAX flattens it, without flattening them (`apply`).
        flat_dict = type(tree) is dict and all(map(is_variable, tree.values()))
        if flat_dict and len(self._leaves) == len(self._params) == len(tree):
            key_of = {id(variable): key for key, variable in tree.items()}
            self._keys = tuple(key_of[id(v)] for v in self._leaves)
        # The types of the variables' arrays: gradients all of them take `apply`'s fast path.
        self._array_types = frozenset(type(v._value) for v in self._params)
        self._spread = any(is_multi_device(v.sharding) for v in self._params)
        self._built = True

    def _watch(self, variables: Any) -> None:
        """Records the Module the Optimizer is built for, if it is one (see `_check_held`)."""
        if isinstance(variables, Node):
            self._module = (weakref.ref(variables), variables_and_structure(variables)[1])

    def _check_held(self) -> None:
        """Refuses to apply gradients once the Module the Optimizer was built for no longer
        holds a variable it optimizes (``model.kernel = Variable(...)``): the update would go
        to the detached variable and the model would not train.

        Raises:
          ValueError: naming the variables the Module no longer holds.
        """
        if self._module is None or self._module[1].unchanged():
            return
        module = self._module[0]()
        if module is None:
            return  # the Module is gone; the variables are the Optimizer's own
        variables, structure = variables_and_structure(module)
        held = set(variables)  # by identity: `Variable.__eq__` is elementwise
        lost = [n for n, v in zip(self._param_names, self._params, strict=True) if v not in held]
        if lost:
            raise ValueError(
                f"Cannot apply gradients with Optimizer '{self._name}': the Module it was built "
                f"for no longer holds the variables it optimizes at {', '.join(map(repr, lost))} "
                "(they were replaced). Create a new Optimizer for the Module (or copy the new "
                "values into the old variables with assign)."
            )
        self._module = (self._module[0], structure)  # only others changed: watch it as it is

    def _require_built(self, action: str) -> None:
        if not self._built:
            raise ValueError(
                f"Cannot {action} Optimizer '{self._name}': it has no variables yet. Give "
                "them at construction, Optimizer(tx, model), or call optimizer.build("
                "variables); apply_gradients(zip(grads, variables)) builds it on first use"
            )

    # ----------------------------------------------------------------- properties

    @property
    def name(self) -> str:
        """The prefix of the state variables' names."""
        return self._name

    @property
    def built(self) -> bool:
        """Whether the state exists: variables were given, or `build` or `apply_gradients` ran."""
        return self._built

    @property
    def variables(self) -> tuple[Variable, ...]:
        """The variables this optimizer updates."""
        return self._params

    @property
    def state_variables(self) -> tuple[Variable, ...]:
        """The non-trainable variables this optimizer keeps: `iterations`, then the optax
        state, named after the parameters (``optimizer/mu/layers/0/kernel``)."""
        return (self._iterations, *self._state)

    @property
    def iterations(self) -> Variable:
        """How many updates were applied: a non-trainable int32 Variable, as in Keras."""
        return self._iterations

    @property
    def learning_rate(self) -> Variable:
        """The learning rate, a non-trainable Variable in the optimizer's state.

        Set it between steps (``opt.learning_rate = 1e-4``): a compiled step reads it as a
        variable, so it is not traced again. It exists when the transformation was built
        with ``optax.inject_hyperparams`` (as ``Optimizer(optax.adam, learning_rate=...)``
        does). With a schedule, it holds the rate of the latest step and cannot be set.

        Raises:
          AttributeError: if the transformation has no injected learning rate.
          ValueError: if the Optimizer is not built yet, or (when set) if a schedule
            gives the learning rate.
          TypeError, ValueError: as `Variable.assign`, for a value that is not a scalar of
            a compatible dtype.
        """
        self._require_built("read the learning rate of")
        variable, _ = self._learning_rate
        if variable is None:
            raise AttributeError(
                f"Optimizer '{self._name}' has no learning rate to read or set: its optax "
                "transformation was not built with optax.inject_hyperparams. Create it as "
                "statevar.Optimizer(optax.adam, learning_rate=1e-3), or with "
                "optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)"
            )
        return variable

    @learning_rate.setter
    def learning_rate(self, value: jax.typing.ArrayLike) -> None:
        self._require_built("set the learning rate of")
        variable = self.learning_rate
        if self._learning_rate[1]:
            raise ValueError(
                f"Cannot set the learning rate of Optimizer '{self._name}' to {value!r}: a "
                "schedule gives it at every step. Pass a number instead of the schedule to "
                "set it by hand"
            )
        variable.assign(value)

    def _statevar_variables(self) -> tuple[Variable, ...]:
        return (*self._params, self._iterations, *self._state)

    def _statevar_named_variables(self) -> tuple[str, dict[str, Variable]]:
        """How a checkpoint keys this optimizer: its name, and its variables by their names
        under it (``"iterations"``, ``"mu/layers/0/kernel"``)."""
        self._require_built("save or restore")
        return self._state_by_name()

    def _state_by_name(self) -> tuple[str, dict[str, Variable]]:
        """Its name and state variables by name, built or not: its pytree (`_pytree`)."""
        named = {"iterations": self._iterations}
        named.update(zip(self._state_names, self._state, strict=True))
        return self._name, named

    # ----------------------------------------------------------------- updates

    def apply(self, grads: Any, variables: Any = None, **extra_args: Any) -> None:
        """Updates the variables in place from ``grads``.

        Donates the variables' and the state's buffers when nothing else holds them;
        arrays read earlier stay valid. Takes three forms of gradients:

        - mirroring the ``variables`` given at construction (or to `build`), as
          `statevar.grad` returns them;
        - a gradient Module, as plain ``jax.grad(loss)(model)`` returns it: its
          variables' views are matched to the optimized variables by name (path); those
          of variables the Optimizer does not optimize (non-trainable ones) are ignored;
        - Keras's ``apply(grads, variables)``: two sequences in the same order, for any
          subset of the variables, as `apply_gradients` takes them zipped.

        Args:
          grads: the gradients. None (a non-trainable slot, or a variable the loss did not
            read) leaves that variable and its optimizer state unchanged, as Keras does for
            the variables it is not given; the first time an optimized variable gets None,
            a warning names it. A gradient held in a Variable (an accumulator) is applied as
            its current value.
          variables: with Keras's form, the variables ``grads`` are for.
          **extra_args: passed to the transformation's update, for those that take more
            than the gradients: ``value=loss`` for ``optax.contrib.reduce_on_plateau``.
            Arrays among them are traced, so a new loss each step compiles nothing again.

        Raises:
          ValueError: if the Optimizer is not built, ``grads`` is structured differently,
            or a gradient's shape does not match its variable's.
          TypeError: if a gradient is not an array, or not of the variable's kind: real
            floating-point for a real variable, complex for a complex one.

        Example:
          >>> import optax, statevar
          >>> w = statevar.Variable([1.0, 2.0], name="w")
          >>> opt = statevar.Optimizer(optax.sgd(0.5), [w])
          >>> opt.apply([w.value], [w])  # Keras's form
          >>> w.numpy()
          array([0.5, 1. ], dtype=float32)
        """
        if variables is not None:
            grads, variables = list(grads), list(variables)
            if len(grads) != len(variables):
                raise ValueError(
                    f"Expected as many gradients as variables in Optimizer '{self._name}'."
                    f"apply(grads, variables); got {len(grads)} gradients and "
                    f"{len(variables)} variables"
                )
            self.apply_gradients(zip(grads, variables, strict=True), **extra_args)
            return
        self._require_built("apply gradients with")
        self._check_held()
        if isinstance(grads, Node):
            by_name = gradients_by_name(grads, self._name, self._param_names, self._params)
            self._warn_missing(by_name)
            self._run(by_name, extra_args)
            return
        # The common cases, checked in C: every optimized variable has a gradient that is an
        # array of the variables' own type (None, a Variable or a NumPy array takes the
        # general path), and every other slot holds None.
        flat = None
        if type(grads) is self._sequence_type and len(grads) == len(self._params):
            flat = grads  # for a list of variables, a list of arrays: nothing to flatten
        elif type(grads) is dict and self._keys is not None and len(grads) == len(self._keys):
            flat = list(map(grads.get, self._keys))  # a key missing gives None: general path
        elif self._full_structure is not None:
            leaves, structure = jax.tree.flatten(grads)
            if structure == self._full_structure:
                flat = leaves
        if flat is not None and self._array_types.issuperset(map(type, flat)):
            # Arrays of the variables' own type (no None, no Variable, no NumPy array): their
            # shapes and dtypes are checked as the update traces, once per signature.
            self._apply_flat(flat, extra_args)
            return
        self._apply_structured(grads, extra_args)

    def _apply_structured(self, grads: Any, extra_args: dict[str, Any]) -> None:
        """`apply`'s general path: gradients mirroring the variables, None among them."""
        leaves, treedef = jax.tree.flatten(grads, is_leaf=lambda x: x is None or is_variable(x))
        if treedef != self._treedef:
            raise ValueError(
                f"Expected gradients structured like the optimizer's variables, "
                f"{self._treedef}, got {treedef}"
            )
        by_variable = {v: g for v, g in zip(self._leaves, leaves, strict=True) if g is not None}
        self._warn_missing(by_variable)
        self._run(by_variable, extra_args)

    def _warn_missing(self, by_variable: dict[Variable, Any]) -> None:
        """Warns, once per variable, of an optimized variable given no gradient (a frozen
        one, trainable=False since the build, gets None by design)."""
        unwarned = [
            v
            for v in self._params
            if v.trainable and v not in by_variable and v not in self._warned_no_gradient
        ]
        if unwarned:
            self._warned_no_gradient.update(unwarned)
            warnings.warn(
                f"Optimizer got no gradient for {', '.join(repr(v.name) for v in unwarned)}: "
                "the loss does not reach these variables, so they and their optimizer state "
                "are left unchanged",
                UserWarning,
                stacklevel=caller_stacklevel(),
            )

    def apply_gradients(
        self, grads_and_vars: Iterable[tuple[Any, Variable]], **extra_args: Any
    ) -> None:
        """Updates variables in place from ``(gradient, variable)`` pairs, as in Keras.

        Takes ``zip(grads, variables)`` for any subset of the variables the Optimizer was
        built for; the others, and those whose gradient is None, keep their values and their
        optimizer state. An Optimizer created without variables is built, on the first call,
        for the variables given. Donates the buffers as `apply` does.

        Args:
          grads_and_vars: an iterable of ``(gradient, variable)`` pairs. A gradient held in
            a Variable (an accumulator) is applied as its current value.
          **extra_args: passed to the transformation's update, as in `apply`.

        Raises:
          TypeError: if an item is not a ``(gradient, Variable)`` pair, or a gradient is not
            an array, or not of the variable's kind (as in `apply`).
          ValueError: if a variable appears twice, is not one the optimizer updates, or a
            gradient's shape does not match its variable's.
          TraceContextError: if the first call, which builds the Optimizer, runs where its
            state cannot be created (see `build`).
        """
        if isinstance(grads_and_vars, Node):  # a gradient Module, as `apply` takes it
            self.apply(grads_and_vars, **extra_args)
            return
        try:
            pairs = list(grads_and_vars)
        except TypeError:
            raise TypeError(
                f"Expected Optimizer '{self._name}'.apply_gradients to get (gradient, "
                "variable) pairs, as zip(grads, variables) gives; got "
                f"{type(grads_and_vars).__name__}, which is not iterable"
            ) from None
        for i, pair in enumerate(pairs):
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise TypeError(
                    f"Expected (gradient, variable) pairs, as zip(grads, variables) gives; got "
                    f"{type(pair).__name__} at position {i}"
                )
            if not isinstance(pair[1], Variable):
                raise not_a_variable(
                    pair[1],
                    "apply_gradients' pairs",
                    f"position {i}",
                    f"Expected (gradient, variable) pairs, as zip(grads, variables) gives; got "
                    f"a {type(pair[1]).__name__} in place of the variable at position {i}",
                )
        if not self._built:
            self.build([variable for _, variable in pairs])
        by_variable: dict[Variable, Any] = {}
        for gradient, variable in pairs:
            if variable in by_variable:
                raise ValueError(
                    f"Variable '{variable.name}' appears twice in apply_gradients' pairs; "
                    "give each variable once, with the sum of its gradients"
                )
            if gradient is not None:
                by_variable[variable] = gradient
        self._run(by_variable, extra_args)

    def _run(self, by_variable: dict[Variable, Any], extra_args: dict[str, Any]) -> None:
        """Checks every gradient, then applies them: nothing changes if one is refused.

        A gradient held in a Variable (an accumulator, as Keras users keep them) is read:
        its current value is applied."""
        params = set(self._params)
        for variable, gradient in by_variable.items():
            gradient = by_variable[variable] = read_operand(gradient)
            if variable not in params:
                raise ValueError(
                    f"Got a gradient for Variable '{variable.name}', which Optimizer "
                    f"'{self._name}' does not update: it was not among the variables the "
                    "Optimizer was built for, or was not trainable (or not floating-point) "
                    "then. Set trainable=True before building the Optimizer, or create "
                    "another Optimizer for it."
                )
            if not hasattr(gradient, "shape"):
                raise TypeError(
                    f"Expected an array gradient for Variable '{variable.name}', got "
                    f"{type(gradient).__name__}"
                )
            check_gradient_shape(variable, gradient)
        if not by_variable:
            return  # nothing to update: not even a step to count
        self._apply_flat([by_variable.get(v) for v in self._params], extra_args)

    def _apply_flat(self, flat: list[Any], extra_args: dict[str, Any]) -> None:
        if STATE.open_trace_frames and _frames.innermost() is not None:
            self._apply_traced(*flat, **extra_args)
            return
        if self._spread:
            # A gradient committed elsewhere than its sharded parameter is copied there.
            flat = list(map(placed_gradient, flat, self._params))
        # Arrays as separate arguments take statevar.jit's fast path for array calls.
        self._compiled_apply(*flat, **extra_args)

    def _apply_traced(self, *grads: Any, **extra_args: Any) -> None:
        # Checked as the update traces (again for each new signature), so free per step;
        # nothing runs, and nothing is donated, when one is refused.
        for variable, gradient in zip(self._params, grads, strict=True):
            if gradient is not None:
                check_gradient_shape(variable, gradient)
                check_gradient_dtype(variable, gradient)
        names = self._param_names
        params = {name: v.value for name, v in zip(names, self._params, strict=True)}
        state = self._state_treedef.unflatten(
            [
                s.value if impl is None else jax.random.wrap_key_data(s.value, impl=impl)
                for s, impl in zip(self._state, self._state_key_impls, strict=True)
            ]
        )
        filled = {
            name: jnp.zeros_like(params[name]) if g is None else g
            for name, g in zip(names, grads, strict=True)
        }
        # A transformation that takes no extra arguments (optax.sgd(0.1)) ignores them.
        tx = optax.with_extra_args_support(self._tx) if extra_args else self._tx
        try:
            updates, new_state = tx.update(filled, state, params, **extra_args)
        except TypeError as error:
            error.add_note(
                f"(in Optimizer '{self._name}': what the transformation's update needs "
                "besides the gradients is passed to apply as keywords: "
                "optimizer.apply(grads, value=loss))"
            )
            raise
        new_params = cast(dict[str, jax.Array], optax.apply_updates(params, updates))
        for variable, name, gradient in zip(self._params, names, grads, strict=True):
            if gradient is not None:
                # Projected after the update, as TensorFlow's and Keras's optimizers do.
                variable.assign(constrained(variable, new_params[name]))
        new_leaves = [
            jax.random.key_data(leaf) if is_key(leaf) else leaf
            for leaf in jax.tree.leaves(new_state)
        ]
        for variable, owner, new in zip(self._state, self._state_owners, new_leaves, strict=True):
            # A variable given no gradient keeps its own state (Adam's moments, say).
            if owner is None or grads[owner] is not None:
                variable.assign(new)
        self._iterations.assign_add(1)

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        register_optimizer(cls)

    def __deepcopy__(self, memo: dict) -> Optimizer:
        duplicate = object.__new__(type(self))
        memo[id(self)] = duplicate
        for key, value in vars(self).items():
            if key != "_module":
                setattr(duplicate, key, copy.deepcopy(value, memo))
        # The copy watches the copy of the Module, when that was copied with it.
        duplicate._module = None
        module = self._module[0]() if self._module is not None else None
        if module is not None and id(module) in memo:
            duplicate._watch(memo[id(module)])
        return duplicate

    def __repr__(self) -> str:
        built = f"{len(self._params)} variables" if self._built else "not built"
        count = len(self.state_variables)
        return f"<statevar.Optimizer {self._name!r}: {built}, {count} state variables>"


register_optimizer(Optimizer)
