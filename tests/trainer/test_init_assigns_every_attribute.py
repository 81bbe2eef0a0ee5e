"""Every attribute of a trainer class is first assigned in its ``__init__``.

Why: the old 487-line ``Trainer`` grew its model, optimizer, corpus, device and resume point in
``_preflight``/``_load``/``_train``, so which attribute existed when (and what a crash report or a
boundary hook could read) depended on how far ``run()`` had got. Now each phase returns a typed value
and every object is whole once constructed. This walks the source (no import, no torch) so the rule
also holds for classes no test happens to run.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The bundled trainer and the in-job kit it is built on.
SOURCES = (ROOT / "orch_trainer", ROOT / "orchestrator" / "kit")
_INIT = ("__init__", "__post_init__")


def _attribute_targets(node: ast.AST, self_name: str) -> list[str]:
    """Names X of every ``self.X`` that ``node`` assigns (tuples, starred and annotated targets too)."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
        targets = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
    else:
        return []
    names: list[str] = []
    stack = list(targets)
    while stack:
        t = stack.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            stack.extend(t.elts)
        elif isinstance(t, ast.Starred):
            stack.append(t.value)
        elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == self_name:
            names.append(t.attr)
    return names


def _is_dataclass(cls: ast.ClassDef) -> bool:
    def name(d: ast.expr) -> str:
        d = d.func if isinstance(d, ast.Call) else d
        return d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")
    return any(name(d) == "dataclass" for d in cls.decorator_list)


def first_assigned_outside_init(source: str) -> list[str]:
    """``Class.attr (method)`` for each attribute a method assigns that ``__init__`` never does."""
    offences: list[str] = []
    for cls in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)):
        methods = [f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        in_init: set[str] = set()
        if _is_dataclass(cls):  # the generated __init__ assigns every annotated field
            in_init |= {s.target.id for s in cls.body
                        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
        elsewhere: list[tuple[str, str]] = []
        for f in methods:
            decorators = {getattr(d, "id", "") for d in f.decorator_list}
            if not f.args.args or decorators & {"staticmethod", "classmethod"}:
                continue
            self_name = f.args.args[0].arg
            assigned = [a for node in ast.walk(f) for a in _attribute_targets(node, self_name)]
            if f.name in _INIT:
                in_init.update(assigned)
            else:
                elsewhere += [(a, f.name) for a in assigned]
        offences += sorted({f"{cls.name}.{a} ({m})" for a, m in elsewhere if a not in in_init})
    return offences


def test_every_trainer_class_assigns_all_its_attributes_in_init():
    offences, classes = [], set()
    for path in sorted(p for d in SOURCES for p in d.glob("*.py")):
        source = path.read_text()
        classes |= {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)}
        offences += [f"{path.name}: {o}" for o in first_assigned_outside_init(source)]
    # The scan must have seen the classes it is about (a moved module would otherwise pass vacuously).
    assert {"Trainer", "TrainLoop", "CheckpointManager", "Heartbeat", "FaultInjector", "PreemptionFlag"} <= classes
    assert not offences, "first assigned outside __init__: " + ", ".join(offences)


def test_the_check_catches_a_phase_method_that_creates_attributes():
    """The shape of the old Trainer: ``_load`` creating the model; tuple, augmented and nested targets."""
    source = '''
class Old:
    def __init__(self, args):
        self.args = args
        self.step = 0

    def _load(self):
        self.model, (self.optimizer, *self.rest) = build()
        self.step += 1
        self.args = None

    def _train(self):
        def inner():
            self.rng: dict = {}
        with open("x") as self.log:
            pass

    @staticmethod
    def helper(obj):
        obj.anything = 1


@dataclass(frozen=True)
class Value:
    a: int

    def __post_init__(self):
        self.b = 1

    def later(self):
        self.a, self.c = 1, 2
'''
    assert first_assigned_outside_init(source) == [
        "Old.log (_train)", "Old.model (_load)", "Old.optimizer (_load)", "Old.rest (_load)", "Old.rng (_train)",
        "Value.c (later)",
    ]
