"""The zoo's imports (models/): relative inside the zoo, so static tools see them, and no
import circle (a module importing, through others, itself), function-local imports included."""

import ast
import pathlib

ZOO = pathlib.Path(__file__).resolve().parents[2] / "models"


def _modules():
    """`{dotted name relative to the zoo ("" for its __init__): path}`."""
    modules = {}
    for path in ZOO.rglob("*.py"):
        parts = path.relative_to(ZOO).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        modules[".".join(parts)] = path
    return modules


def _resolve(dotted, names):
    parts = dotted.split(".") if dotted else []
    while parts and ".".join(parts) not in names:
        parts.pop()
    return ".".join(parts)


def zoo_imports():
    """`{module: the zoo modules it imports}`, every import statement (at any depth, however
    spelled), and the absolute `keras_attn.models` imports found `[(module, line)]`."""
    modules = _modules()
    edges, absolute = {name: set() for name in modules}, []
    for name, path in modules.items():
        package = name.split(".") if name else []
        if path.name != "__init__.py":
            package = package[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                zoo = [a.name for a in node.names if a.name.startswith("keras_attn.models")]
                absolute += [(name, node.lineno)] * bool(zoo)
                targets = [z[len("keras_attn.models") :].lstrip(".") for z in zoo]
            elif isinstance(node, ast.ImportFrom) and node.level:
                base = package[: len(package) - (node.level - 1)]
                if node.level - 1 > len(package):
                    continue  # above the zoo (`from ... import models`: the zoo itself)
                stem = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{stem}.{a.name}".strip(".") for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "keras_attn.models"
            ):
                absolute.append((name, node.lineno))
                stem = node.module[len("keras_attn.models") :].lstrip(".")
                targets = [f"{stem}.{a.name}".strip(".") for a in node.names]
            for target in targets:
                resolved = _resolve(target, modules)
                if resolved != name:
                    edges[name].add(resolved)
    return edges, absolute


def circles(edges):
    """The strongly connected sets of more than one module (Tarjan's algorithm)."""
    index, low, on, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_zoo_has_no_import_circle():
    edges, _ = zoo_imports()
    assert circles(edges) == []
    assert {"generation.config", "generation.loop"} <= set(edges)  # the graph was read
    assert "generation.config" in edges["generation.loop"]


def test_the_zoo_imports_itself_relatively():
    _, absolute = zoo_imports()
    assert absolute == [], absolute  # (`from keras_attn.models...`: invisible to static tools)


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
