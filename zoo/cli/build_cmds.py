"""Making entries: build, train, reproduce, export, import, vocabulary, docs."""

from __future__ import annotations

import json
from typing import Optional

import typer

from zoo import catalog
from zoo.errors import ZooError
from zoo.fsutil import plural
from zoo.reproduce import reproduce as run_reproduce
from zoo.kinds import KINDS
from zoo.cli.app import app, out, err, human, metric_text


@app.command()
def build(names: list[str] = typer.Argument(None, help="Entries to build."),
          all_entries: bool = typer.Option(False, "--all", help="Build every entry that has a recipe."),
          nproc: int = typer.Option(2, help="Training processes (torchrun --nproc_per_node)."),
          threads: int = typer.Option(1, help="Threads per process (fixed for reproducible bytes)."),
          no_train: bool = typer.Option(False, "--no-train", help="Only write the card's static fields "
                                        "(dataset, parameter count, inputs/outputs, planned variants)."),
          allow_dirty: bool = typer.Option(False, "--allow-dirty", help="Build from a tree with uncommitted changes "
                                           "(recorded on the card as not reproducible).")) -> None:
    """Build entries from their recipes and write their cards.

    Train, export, measure and write the cards' measured fields, from a clean, committed tree."""
    targets = catalog.list_models() if all_entries else (names or [])
    if all_entries:
        targets = [n for n in targets if catalog.get_card(n).training.recipe]
    if not targets:
        raise ZooError("name an entry to build, or pass --all")
    for name in targets:  # an unknown entry or a card path outside its folder: refused before torch loads
        catalog.raw_card(name)
    from zoo.build import build as build_entry, describe  # lazy: torch + onnxruntime (~5 s)
    for name in targets:
        if no_train:
            out.print(f"described {name}: {describe(name)}")
            continue
        path = build_entry(name, nproc=nproc, threads=threads, log=lambda m: err.print(m, markup=False),
                           allow_dirty=allow_dirty, writes=targets)
        out.print(f"built {name}: {path}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train(ctx: typer.Context,
          nproc_per_node: int = typer.Option(1, "--nproc-per-node", help="Training processes on this node."),
          nnodes: int = typer.Option(1, help="Nodes in the job (each runs this command)."),
          node_rank: int = typer.Option(0, "--node-rank", help="This node's rank (0 .. nnodes-1)."),
          rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT every node meets at "
                                                      "(needed with --nnodes > 1)."),
          max_restarts: int = typer.Option(0, "--max-restarts", help="Restart failed workers this many times "
                                           "(they resume from the newest checkpoint)."),
          launcher: Optional[str] = typer.Option(None, help="ddp, fsdp, deepspeed, tensor_parallel or pipeline "
                                                 "(default: the one implementing the recipe's parallelism).")) -> None:
    """Train with a recipe under torchrun, checking it first.

    E.g. `zoo train --recipe qat-int8 --nproc-per-node 2
    steps=50`. Other options (--recipe, --model, --backend, --output-dir, --resume, --no-tracking, key=value) go to
    the launcher, as with `torchrun launchers/NAME.py`."""
    from zoo.train.launch import torchrun  # lazy: torch loads in seconds; `zoo list` and `--help` must not wait for it

    torchrun(list(ctx.args), nproc_per_node, nnodes, node_rank, rdzv_endpoint, max_restarts, launcher)


@app.command()
def reproduce(name: str, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Rebuild an entry at its card's commit and compare sha256s.

    The build runs in a temporary git worktree; every file's sha256 is compared with the card."""
    r = run_reproduce(catalog.get_entry(name), log=lambda m: err.print(m, markup=False))
    if as_json:
        print(json.dumps({"entry": r.entry, "commit": r.commit, "identical": r.identical, "comparable": r.comparable,
                          "differences": r.differences,
                          "files": [{**f.__dict__, "same": f.same} for f in r.files]}, indent=2))
    else:
        out.print(f"{name} at commit {r.commit}:")
        for f in r.files:
            out.print(f"  {'same     ' if f.same else 'DIFFERENT'} {f.file}\n    card    {f.card_sha256}\n"
                      f"    rebuilt {f.rebuilt_sha256 or '(not produced)'}")
        if r.differences:
            out.print("this machine differs from the card's build: " + "; ".join(r.differences))
    if not r.identical:
        raise ZooError(f"{sum(not f.same for f in r.files)} of {plural(len(r.files), 'file')} of '{name}' did not reproduce"
                       + ("" if r.comparable else " (expected: " + "; ".join(r.differences) + ")"))


_FROM_FP32 = ", ".join(k for k, kind in KINDS.items() if kind.made == "from-fp32")


@app.command("export")
def export_cmd(name: str, variant: list[str] = typer.Option(..., help=f"Variants to make from the fp32 file ({_FROM_FP32}) "
                                                            "that the entry's recipe does not make, or one the card "
                                                            "declares with `recipe:` (federated retraining).")) -> None:
    """Make variants from an entry's fp32 file (no retraining).

    The fp32 file is fetched; the variants are written into the entry and its card."""
    catalog.raw_card(name)  # an unknown entry or a card path outside its folder: refused before torch loads
    from zoo.build import export_variant  # lazy: torch + onnxruntime (~5 s)

    for key in variant:
        path = export_variant(name, key, log=lambda m: err.print(m, markup=False))
        v = catalog.get_card(name).variants[key]
        out.print(f"exported {name} {key}: {path} ({human(v.size)}, sha256 {v.sha256[:12]}…, "
                  f"accuracy {metric_text(v.metrics.get('accuracy'))})")


@app.command("import")
def import_cmd(name: str, source: str = typer.Option(..., "--from", help="Checkpoint folder (config.json + "
                                                    "model.safetensors), or hf:<repo id> from the local Hugging Face "
                                                    "cache (offline), e.g. hf:bert-base-uncased."),
               nproc: int = typer.Option(2, help="Fine-tuning processes."),
               threads: int = typer.Option(1, help="Threads per process."),
               allow_dirty: bool = typer.Option(False, "--allow-dirty", help="Build from a tree with uncommitted "
                                                "changes (recorded as not reproducible).")) -> None:
    """Import an upstream BERT checkpoint as a zoo entry.

    Parity check against transformers, then fine-tune a task head and make every variant."""
    from zoo.build import import_entry  # lazy: torch + onnxruntime (~5 s)

    from zoo.importer import resolve_source  # lazy: with the build

    path = import_entry(name, resolve_source(source), nproc, threads, log=lambda m: err.print(m, markup=False),
                        allow_dirty=allow_dirty)
    out.print(f"imported {name}: {path}")


@app.command()
def vocabulary() -> None:
    """Train the langid-16k WordPiece vocabulary anew.

    On the training split's sample; it is written into the checkout
    (zoo/data/vocab/): a deliberate change, after which every entry trained on it is rebuilt."""
    from zoo.data.langid import write_vocabulary  # lazy: torch loads with the datasets; `zoo --help` must not wait

    out.print(f"wrote {write_vocabulary()}; rebuild every entry on this dataset (zoo build NAME)")


@app.command()
def docs() -> None:
    """Generate the docs site's pages from the cards.

    Model pages and references (then `mkdocs build`)."""
    from zoo.docs import generate  # lazy: torch + onnxruntime (~5 s)

    for path in generate():
        out.print(f"wrote {path}")
