"""The package's shape: an acyclic import graph with imports at the top, and one table of variant kinds that the
stages read instead of branching on a kind's name or format."""

from __future__ import annotations

import ast
import copy
import dataclasses
import subprocess
import sys
from pathlib import Path
from pkgutil import resolve_name

import pytest
import torch

from tests.helpers import REPO, fresh_python
from zoo import docs, kinds, layouts
from zoo.cards import parse_card
from zoo.docs.model_page import launcher_commands
from zoo.docs.reference import recipes_reference
from zoo.errors import CardError, ZooError
from zoo.export import export_fp32
from zoo.kinds import KINDS, Kind, Training, kind_of, quantization_schemes, trained_kinds
from zoo.layouts import Layout
from zoo.models import build_model, model_spec
from zoo.models.registry import REGISTRY, ModelSpec
from zoo.recipes import load_recipe
from zoo.train.distributed import DistContext
from zoo.train.arguments import parse_args
from zoo.train.launch import prepare, sweep_cells, torchrun
from zoo.train.parallel import make_strategy, matrix_markdown, support_matrix
from zoo.train.parallel.ddp import DDPStrategy
from zoo.train.schedule import Phase
from zoo.train.trainer import run
from zoo.variants.make import TOOLS

PACKAGE = REPO / "zoo"
# Optional dependencies the package imports only where they are used (make setup may not manage to build them).
OPTIONAL = ("deepspeed", "horovod", "oneccl_bindings_for_pytorch")
# Modules on the path of fast commands, which import torch + onnxruntime (~5 s) only when the work needs them:
# the CLI and `import zoo` (command implementations), and fetch (only to make a file no store has).
LIGHT_ENTRY_POINTS = ("zoo.cli", "zoo", "zoo.store.fetch")  # and every module of the zoo.cli package
# Per-rank costs a training process pays only when its rank or recipe needs them (every torchrun rank imports the
# trainer): torchao for quantizing recipes, onnxruntime on the exporting rank, mlflow (and its sqlalchemy) on the
# tracking rank.
# A federated client holds its data file; only the simulation's virtual clients compute a shard from the (torch) dataset.
# onnxruntime-training's artifact generator imports torch where installed: a ClientApp needs it in its first round only.
# A rank imports only its own parallel strategy (DTensor, pipelining and DeepSpeed take ~2 s of CPU to import); the
# models import DTensor's tensor-parallel styles only for a tensor-parallel plan (`import zoo.models`: 1.9 -> 1.4 s), the
# checkpoints DCP only to save or resume one (`import zoo.train.launch`: 2.3 -> 1.5 s).
# `zoo build` (held with both CPUs in the tests) imports transformers (zoo.importer, ~3 s) only for an imported entry
# and MLflow (~2 s) only for a build that tracked.
RANK_LAZY = {"zoo.build": ("zoo.importer", "zoo.registry", "mlflow"),
             "zoo.train.trainer": ("zoo.train.qat", "zoo.train.exports"), "zoo.train.tracking": ("mlflow", "sqlalchemy"),
             "zoo.train.parallel": ("zoo.train.parallel.",),
             "zoo.models.cnn": ("torch.distributed.tensor",), "zoo.models.bert": ("torch.distributed.tensor",),
             "zoo.train.checkpoint": ("torch.distributed.checkpoint",), "zoo.train.entry": ("zoo.train.launch",),
             "zoo.federated.client": ("zoo.fleet",),
             "zoo.ondevice.engine": ("onnxruntime.training.artifacts", "onnxruntime.training.onnxblock")}
# The stages (files, or folders of them) that must read the kinds table, never branch on a kind's name or format.
STAGES = ["build.py", "export.py", "ort_quantize.py", "onnx_passes.py", "metadata.py", "store/fetch.py", "store/publish.py",
          "validate.py", "evaluate.py", "docs",
          "cli", "catalog.py", "train/exports.py", "train/trainer.py"]


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(path: Path) -> list[tuple[ast.AST, list[str]]]:
    """(node, imported module names) of every import statement in the file, top-level or not."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.append((node, [a.name for a in node.names]))
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node, [f"{node.module}.{a.name}" for a in node.names] + [node.module]))
    return found


def _import_time_imports(path: Path) -> set[tuple[int, int]]:
    """(line, column) of the import statements that run when the module is imported: at the top level, or inside a top-level
    `with` (e.g. `zoo.logs.quiet` around a noisy library's import), `try` or `if`; not inside a function or class."""
    found: set[tuple[int, int]] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.add((node.lineno, node.col_offset))
            elif isinstance(node, (ast.With, ast.If, ast.Try)):
                visit(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
                      + [s for h in getattr(node, "handlers", []) for s in h.body])

    visit(ast.parse(path.read_text()).body)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for _, imported in _imports(path):
            graph[name] |= {m for m in map(owner, imported) if m and m != name and not name.startswith(m + ".")}
    return graph


def test_the_package_has_no_import_cycles():
    graph, state, cycles = _graph(), {}, []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [node, nxt]) if nxt in stack else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, [*stack, node])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, cycles


def test_packages_point_one_way():
    """At the level of zoo's packages and top modules (zoo.store, zoo.kinds, zoo.train, ...), no two import each other:
    what several stages need (pointers, the kinds table, metadata keys, the strict base) sits at the bottom, not
    inside one stage's package."""
    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])

    edges: dict[tuple[str, str], list[str]] = {}
    for module, imported in _graph().items():
        for other in imported:
            if unit(module) != unit(other):
                edges.setdefault((unit(module), unit(other)), []).append(f"{module} -> {other}")
    ties = [f"{a} <-> {b}: {edges[a, b][:2]} / {edges[b, a][:2]}" for a, b in sorted(edges) if a < b and (b, a) in edges]
    assert not ties, ties
    # Nor round a longer loop (zoo.train -> zoo.variants -> zoo.federated -> zoo.train): every package reaches only
    # packages that cannot reach it back.
    reach: dict[str, set[str]] = {}
    for a, b in edges:
        reach.setdefault(a, set()).add(b)
    changed = True
    while changed:
        changed = False
        for a in list(reach):
            more = set().union(*(reach.get(b, set()) for b in reach[a])) - reach[a]
            if more:
                reach[a] |= more
                changed = True
    loops = sorted(a for a in reach if a in reach[a])
    assert not loops, "packages in an import loop: " + ", ".join(
        f"{a} -> {b} ({edges[a, b][0]})" for a, b in sorted(edges) if a in loops and b in loops)


def test_imports_are_at_the_top_except_documented_lazy_ones():
    offenders = []
    for name, path in _modules().items():
        lines = path.read_text().splitlines()
        at_import = _import_time_imports(path)
        for node, imported in _imports(path):
            if (node.lineno, node.col_offset) in at_import:
                continue
            allowed = (name in LIGHT_ENTRY_POINTS or name.startswith("zoo.cli.")
                       or any(m.split(".")[0] in OPTIONAL for m in imported)
                       or any(m.startswith(RANK_LAZY.get(name, ("-",))) for m in imported))
            if not allowed or "# lazy:" not in lines[node.lineno - 1]:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not offenders, "function-local imports (top of the module, or an optional dependency with a "\
                          "`# lazy: why` comment):\n" + "\n".join(offenders)


def test_importing_the_zoo_leaves_logging_alone_and_its_noisy_imports_say_nothing():
    """No behaviour at import time: `import zoo` (and the CLI, fetch) change no logger, no environment variable and no
    import machinery; the modules that import the
    libraries noisy while imported (torchao, transformers) do it under zoo.logs.quiet, which restores the levels."""
    from zoo.logs import NOISY_IMPORTS

    names = ("", *NOISY_IMPORTS)
    probe = ("import logging\n"
             f"names = {names!r}\n"
             "levels = lambda: [logging.getLogger(n).level for n in names]\n"
             "before = levels()\n"
             "import os, sys\n"
             "environ, finders = dict(os.environ), list(sys.meta_path)\n"
             "import zoo, zoo.cli, zoo.store.fetch\n"
             "assert levels() == before, ('import zoo', before, levels())\n"
             "assert dict(os.environ) == environ and sys.meta_path == finders, 'import zoo changed the process'\n"
             "import zoo.train.qat, zoo.importer\n"
             "assert levels() == before, ('import zoo.train.qat, zoo.importer', before, levels())\n")
    result = fresh_python(probe)
    assert result.stderr == "", f"importing the zoo printed: {result.stderr[-2000:]}"


def test_the_models_leave_dtensor_to_tensor_parallel_ranks():
    fresh_python("import sys\nimport zoo.models, zoo.models.bert, zoo.models.cnn\n"
                 "assert 'torch.distributed.tensor' not in sys.modules, 'zoo.models imported DTensor'\n")


def test_the_cli_starts_without_the_libraries_of_its_heavier_commands():
    """Every `zoo` command imports the CLI (the tests alone run a few hundred): numpy (a card's confidence interval)
    and requests (publishing, checking a store) are imported by the commands that use them, not by every start."""
    fresh_python("import sys\nimport zoo.cli\n"
                 "heavy = sorted(m for m in ('numpy', 'requests', 'torch', 'onnxruntime', 'mlflow') if m in sys.modules)\n"
                 "assert not heavy, heavy\n")


def test_onnxruntime_is_imported_only_through_zoo_ort():
    """zoo.ort imports onnxruntime without ORTModule (torch, DeepSpeed, MLflow: 9 s of CPU); a module that uses one of
    its submodules imports zoo.ort first, and nothing is left blocked afterwards."""
    offenders = []
    for name, path in _modules().items():
        if name == "zoo.ort":
            continue
        lines = path.read_text().splitlines()
        first_ort = min((node.lineno for node, imported in _imports(path) if "zoo.ort" in imported), default=None)
        for node, imported in _imports(path):
            if not any(m == "onnxruntime" or m.startswith("onnxruntime.") for m in imported):
                continue
            plain = isinstance(node, ast.Import) or node.module == "onnxruntime"
            if plain or first_ort is None or node.lineno < first_ort:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not offenders, "onnxruntime imported around zoo.ort (use `from zoo.ort import ort`):\n" + "\n".join(offenders)
    probe = ("import sys\n"
             "import zoo.evaluate, zoo.ondevice.engine\n"
             "from zoo.ort import ORTMODULE, ort\n"
             "assert ort is sys.modules['onnxruntime'] and ort.InferenceSession\n"
             "loaded = lambda: sorted(m for m in ('torch', 'deepspeed', 'mlflow', ORTMODULE) if m in sys.modules)\n"
             "assert loaded() == [], loaded()  # ORTModule was neither imported nor left blocked (None)\n"
             "import zoo.ort_quantize  # onnxruntime's transformer optimizer imports torch itself\n"
             "assert loaded() == ['torch'], loaded()\n")
    fresh_python(probe)


def test_the_layout_guide_names_every_module():
    """docs/guides/layout.md (the README's Layout, in full) stays true: every module of the package is named there."""
    import re

    guide = (REPO / "docs" / "guides" / "layout.md").read_text()
    missing = [str(path.relative_to(REPO)) for path in sorted(PACKAGE.rglob("*.py"))
               if path.stem not in ("__init__", "__main__") and not re.search(rf"\b{re.escape(path.stem)}\b", guide)]
    assert not missing, f"modules docs/guides/layout.md does not name: {missing}"


def test_stages_do_not_branch_on_kind_names_or_formats():
    """Comparisons against a kind's key (other than the fp32 reference every card has) or a file format belong to
    zoo/variants; the stages ask the table (kind_of(...).made / .reference / .primary ...)."""
    names = (set(KINDS) - {"fp32"}) | {kind.format for kind in KINDS.values()}
    offenders = []
    for path in [p for stage in STAGES for p in ([PACKAGE / stage] if (PACKAGE / stage).is_file()
                                                   else sorted((PACKAGE / stage).rglob("*.py")))]:
        stage = path.relative_to(PACKAGE)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            constants = [c.value for c in operands if isinstance(c, ast.Constant)]
            constants += [e.value for c in operands if isinstance(c, (ast.Tuple, ast.List, ast.Set)) for e in c.elts
                          if isinstance(e, ast.Constant)]
            attributes = [c.attr for c in operands if isinstance(c, ast.Attribute)]
            if names & set(constants) or {"format", "recipe"} & set(attributes):
                offenders.append(f"{stage}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, offenders


def test_each_kind_is_complete():
    for key, kind in KINDS.items():
        assert kind.key == key and kind.summary and kind.tolerance > 0
        if kind.made == "from-fp32":
            assert kind.tool in TOOLS, f"{key}: no tool makes it from fp32"
        if kind.format == "onnx" and kind.made != "retraining":
            assert {"zoo.precision.weights", "zoo.quantization"} <= set(kind.metadata), key
        if kind.training:  # made by a phase of its own: its hook and exporter resolve
            assert kind.made == "training" and kind.in_recipe, key
            assert callable(resolve_name(kind.training.hook)) and callable(resolve_name(kind.training.exporter)), key
    # Training makes fp32 (the run itself) and the kinds that declare their phase; nothing else claims it.
    assert {k for k, kind in KINDS.items() if kind.made == "training"} == {"fp32"} | {k for k in KINDS if KINDS[k].training}


@pytest.fixture
def test_kind(monkeypatch):
    """A kind that exists only in this test: one entry in the table."""
    kind = dataclasses.replace(KINDS["int8-ptq"], key="int8-test", file="model.int8-test.onnx", quantization="static",
                               summary="a test-only kind", docs_column=True, cpu_dependent=False)
    monkeypatch.setitem(kinds.KINDS, kind.key, kind)
    return kind


def test_a_kind_added_to_the_table_reaches_recipes_cards_and_docs(test_kind: Kind):
    recipe = load_recipe("qat-int8", ["export.variants=[fp32,int8-test]"])
    assert recipe.export.variants == ["fp32", "int8-test"]
    with pytest.raises(CardError, match="unknown; a recipe exports"):
        load_recipe("qat-int8", ["export.variants=[fp32,int8-nope]"])
    card = {"name": "t", "architecture": "digits-cnn", "family": "cnn", "task": "classification", "description": "d",
            "license": "MIT", "dataset": {"name": "digits", "source": "s", "license": "l", "splits": {"test": 1}},
            "preprocessing": [], "inputs": [], "outputs": [], "num_params": 1, "training": {"command": "c"},
            "variants": {"fp32": KINDS["fp32"].card_fields(17), "int8-test": test_kind.card_fields(17)}}
    parsed = parse_card(card, "card.yaml")
    assert kind_of("int8-test", parsed.variants["int8-test"]) is test_kind
    assert not test_kind.primary and test_kind.int8
    with pytest.raises(CardError, match="no kind the zoo knows"):
        parse_card({**card, "variants": {**card["variants"], "int9": test_kind.card_fields(17)}}, "card.yaml")
    assert "int8-test" in docs.index_page({}, {}) and "a test-only kind" in docs.kinds_reference()


class ToyStrategy(DDPStrategy):
    """A layout that exists only in these tests."""


class ToyNet(torch.nn.Module):
    """A family that exists only in these tests: split points, no tensor-parallel plan."""

    def __init__(self, num_classes: int, **_):
        super().__init__()
        self.body, self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16)), torch.nn.Linear(16, num_classes)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))

    def pipeline_blocks(self):
        return [self.body, self.head]


def toy_hook(model, recipe, data, ctx, strategy, train):
    """A trained kind's hook: two more steps of the one loop on a copy of the fp32 model, in a phase of its own."""
    return train(Phase("toy", 2, 1e-3, 0), copy.deepcopy(model), strategy)


def toy_exporter(model, example, path):
    return export_fp32(model, example, path, 17)


def test_a_layout_added_to_the_table_reaches_recipes_launchers_and_docs(monkeypatch):
    """One row in zoo.layouts (and the class it names) is a new parallel layout: the recipe schema accepts it, its
    launcher runs it (sweeps too), the strategy is built from the row, and the README matrix, the launchers guide and
    the recipe reference list it; a model without what the layout needs is refused before any process starts."""
    toy = Layout("toy", "ddp", "a test-only layout", f"{__name__}:ToyStrategy", model_needs="toy_plan")
    monkeypatch.setitem(layouts.LAYOUTS, "toy", toy)
    assert load_recipe("fp32", ["parallelism.strategy=toy"]).parallelism.strategy == "toy"
    with pytest.raises(CardError, match="unknown parallelism strategy 'toy2'; choose one of: .*toy"):
        load_recipe("fp32", ["parallelism.strategy=toy2"])
    assert "`toy`" in recipes_reference() and "| `toy` | a test-only layout |" in layouts.launchers_table()
    assert ("ddp", "toy", 2) in [row[:3] for row in support_matrix()] and "| `toy` |" in matrix_markdown()
    assert layouts.strategy_for("ddp", "toy") == "toy" and layouts.strategy_for("fsdp", "toy") == "fsdp"
    assert [cell for cell, _ in sweep_cells(["parallelism.strategy=ddp,toy"], "ddp")] == ["ddp", "toy"]
    args = parse_args(["--recipe", "fp32", "parallelism.strategy=toy"])
    with pytest.raises(ZooError, match="strategy=toy needs a model that declares toy_plan"):
        prepare("ddp", args)
    monkeypatch.setitem(layouts.LAYOUTS, "toy", dataclasses.replace(toy, model_needs=None))
    recipe, strategy = prepare("ddp", args)
    made = make_strategy(strategy, DistContext(), recipe, lambda: None)
    assert type(made) is ToyStrategy and made.name == "toy"
    with pytest.raises(ZooError, match="launchers/horovod.py jobs start with horovodrun, not torchrun: horovodrun -np 2 "):
        torchrun(["--recipe", "fp32"], nproc_per_node=2, launcher="horovod")  # the launcher table says who starts it


def test_a_family_registered_in_the_models_package_reaches_launchers_and_docs(monkeypatch):
    """One registration (zoo.models) is a new family: recipes train it, and what it offers (split points, no
    tensor-parallel plan) decides which launchers the docs list and which layouts are refused for it."""
    monkeypatch.setitem(REGISTRY, "toy-net", ModelSpec("toy-net", "toy", ToyNet, dataset="digits"))
    assert load_recipe("fp32", model="toy-net").model == "toy-net"
    assert build_model("toy-net", num_classes=10)(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    spec = model_spec("toy-net")
    assert spec.offers("pipeline_blocks") and not spec.offers("tensor_parallel_plan")
    commands = launcher_commands("toy-net", "fp32")
    assert any("launchers/pipeline.py --recipe fp32 --model toy-net" in c for c in commands)
    assert not any("tensor_parallel" in c for c in commands) and len(commands) == len(layouts.LAUNCHERS) - 1
    with pytest.raises(ZooError, match="needs a model that declares tensor_parallel_plan"):
        prepare("tensor_parallel", parse_args(["--recipe", "fp32", "--model", "toy-net"]))


def test_a_kind_made_by_training_is_one_row_with_its_hook(monkeypatch, tmp_path):
    """A kind made by a training phase of its own declares its scheme, hook and exporter; the recipe schema, the
    trainer and the exporter follow the row (the trainer names no kind and no scheme)."""
    toy = Kind("toy-trained", "model.toy.onnx", "fp32", "none", "training", "a test-only trained kind", tolerance=0.01,
               reference="outputs", in_recipe=True, metadata=KINDS["fp32"].metadata,
               training=Training("toy-scheme", f"{__name__}:toy_hook", f"{__name__}:toy_exporter"))
    monkeypatch.setitem(kinds.KINDS, toy.key, toy)
    assert "toy-scheme" in quantization_schemes() and trained_kinds("toy-scheme") == [toy]
    with pytest.raises(CardError, match="toy-trained needs quantization.scheme: toy-scheme"):
        load_recipe("fp32", ["export.variants=[fp32,toy-trained]"])
    recipe = load_recipe("fp32", ["export.variants=[fp32,toy-trained]", "quantization.scheme=toy-scheme", "steps=3",
                                  "epochs=null", "tracking.enabled=false", "checkpoint.interval_steps=0"])
    try:
        summary = run(recipe, DistContext(), output_dir=tmp_path)
    finally:
        torch.use_deterministic_algorithms(False)
    assert list(summary.phases) == ["fp32", "toy"] and summary.phases["toy"].steps == 2
    assert set(summary.torch_accuracy) == {"fp32", "toy-trained"}
    assert summary.variants["toy-trained"].file == "model.toy.onnx" and (tmp_path / "model.toy.onnx").is_file()
    for module in ("trainer", "exports"):
        constants = {n.value for n in ast.walk(ast.parse((PACKAGE / "train" / f"{module}.py").read_text()))
                     if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert not constants & ({*KINDS, *quantization_schemes()} - {"fp32", "none"}), module


def test_a_ddp_rank_imports_no_other_strategy():
    """What every torchrun rank of a DDP run imports (the trainer, the models, the DDP strategy) leaves DeepSpeed,
    pipelining, Horovod and the other strategies unimported; the strategy that needs one imports it."""
    others = ("deepspeed", "horovod", "torch.distributed.pipelining", "zoo.train.parallel.fsdp",
              "zoo.train.parallel.tensor", "zoo.train.parallel.pipeline", "zoo.train.parallel.deepspeed")
    script = ("import sys\nfrom zoo.train.trainer import run\n"
              "from zoo.models import build_model\n"
              "build_model('bert-tiny', num_classes=8, vocab_size=100), build_model('digits-cnn', num_classes=10)\n"
              f"print(sorted(m for m in {others!r} if m in sys.modules))\n"
              "from zoo.train.parallel import strategy_class\nstrategy_class('pp')\n"
              "print('torch.distributed.pipelining' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0 and result.stdout.split("\n")[:2] == ["[]", "True"], result.stdout + result.stderr


def test_the_code_passes_the_linter():
    """ruff, configured in pyproject.toml ([tool.ruff]: line length, pycodestyle, pyflakes), over the whole checkout."""
    ruff = Path(sys.executable).parent / "ruff"
    assert ruff.exists(), "ruff is missing: `make setup` installs the dev dependencies"
    result = subprocess.run([str(ruff), "check", "--no-cache", "--output-format", "concise", str(REPO)],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]


def test_only_the_models_package_knows_the_families():
    """What a family offers is declared on its spec (zoo.models: transformer, split points, tensor-parallel plan,
    checkpoints it imports); stages ask the spec, never compare a family's name."""
    offenders = []
    for name, path in _modules().items():
        if name.startswith("zoo.models"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(o, ast.Attribute) and o.attr == "family"
                                                     for o in [node.left, *node.comparators]):
                constants = [c for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                if constants:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, offenders
