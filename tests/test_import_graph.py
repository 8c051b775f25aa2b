"""The package's modules form layers: each imports only modules below it, at the top."""

import ast
import graphlib
import pathlib
import subprocess
import sys

import statevar

PACKAGE = pathlib.Path(statevar.__file__).parent


def _imports(path: pathlib.Path) -> tuple[set[str], list[str]]:
    """Returns the statevar modules ``path`` imports at run time at its top level, and a
    description of each import of a statevar module made anywhere else."""
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    elsewhere: list[str] = []
    # A module-level import, or one in a module-level try (an optional extension's).
    top_level = {
        id(node)
        for block in tree.body
        for node in ([block] + (block.body if isinstance(block, ast.Try) else []))
    }
    type_checking = {
        id(node)
        for block in tree.body
        if isinstance(block, ast.If)
        and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for node in ast.walk(block)
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level != 1:
            continue
        modules = [node.module] if node.module else [alias.name for alias in node.names]
        if id(node) in top_level:
            top.update(modules)
        elif id(node) not in type_checking:  # imports for type checkers only never run
            elsewhere += [f"{path.name}:{node.lineno} imports {m}" for m in modules]
    return top, elsewhere


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    graph, elsewhere = {}, []
    for path in sorted(PACKAGE.glob("*.py")):
        graph[path.stem], found = _imports(path)
        elsewhere += found
    return graph, elsewhere


def test_no_module_imports_another_inside_a_function():
    # An import inside a function is how a cycle hides; every import is at the top.
    assert _graph()[1] == []


def test_the_import_graph_has_no_cycle():
    graph, _ = _graph()
    order = list(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError
    assert order[-1] == "__init__"  # the package imports everything; nothing imports it


def test_no_module_imports_a_higher_one_even_for_type_checkers():
    # A lower floor that needs a higher type names it by a Protocol instead.
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        for block in tree.body:
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test):
                relative = [
                    node
                    for node in ast.walk(block)
                    if isinstance(node, ast.ImportFrom) and node.level == 1
                ]
                assert not relative, f"{path.name} imports statevar modules for type checkers"


def test_the_foundations_import_nothing_above_them():
    graph, _ = _graph()
    # Errors and the signal guard import no statevar module, the shared state only the C
    # extension (which imports none); the core Variable imports nothing that walks trees,
    # traces, compiles, optimizes or checkpoints.
    assert graph["_errors"] == set() and graph["_signals"] == set()
    assert graph["_state"] == set()
    above_the_variable = {"_tree", "_module", "_jit", "_grad", "_optim", "_checkpoint"}
    assert not graph["_variable"] & above_the_variable


def test_importing_statevar_leaves_jax_unconfigured():
    # JAX options that take effect when its backends start (jax_num_cpu_devices,
    # jax_platforms) can still be set after ``import statevar``.
    code = (
        "import statevar, jax\n"
        "jax.config.update('jax_num_cpu_devices', 3)\n"
        "print(len(jax.devices('cpu')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "3"
