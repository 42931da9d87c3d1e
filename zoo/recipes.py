"""Recipes: pure data (recipes/*.yaml) validated by a schema, with `key=value` command-line overrides.

A wrong key or value is an error naming the recipe file and the field. The schema already names
every parallelism the launchers will implement, so one recipe runs under any of them.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import AfterValidator, Field, model_validator

from zoo.cards import PublishedFile, read_yaml, validate_file_data
from zoo.config import REPO_ROOT
from zoo.errors import CardError, ZooError
from zoo.pointer import sha256_file
from zoo.layouts import LAYOUTS
from zoo.strict import OneOf, Strict
from zoo.kinds import KINDS, quantization_schemes, recipe_kinds

RECIPES_DIR = REPO_ROOT / "recipes"


class Optimizer(Strict):
    name: Literal["adamw", "sgd"] = "adamw"  # torch.optim.AdamW or SGD with momentum
    lr: float = Field(1e-3, gt=0)  # peak learning rate (after warm-up)
    weight_decay: float = Field(0.0, ge=0)  # decoupled (AdamW) or L2 (SGD)
    momentum: float = Field(0.9, ge=0)  # sgd only


class Schedule(Strict):
    name: Literal["constant", "cosine"] = "cosine"  # learning-rate schedule after warm-up
    warmup_steps: int = Field(0, ge=0)  # linear warm-up from 0 to lr


class Quantization(Strict):
    # A way to train after fp32 that makes a variant kind of its own (zoo.kinds: the kind's `training`): qat-int8 is
    # fake-quantized fine-tuning, which makes the int8-qat file.
    scheme: Annotated[str, AfterValidator(OneOf(quantization_schemes, "quantization scheme"))] = "none"
    # QAT fine-tunes the trained fp32 model with fake quantization for this many optimizer steps.
    qat_steps: int = Field(100, ge=1)
    qat_lr: float = Field(1e-4, gt=0)  # learning rate of the QAT fine-tuning
    max_accuracy_drop: float = Field(0.005, ge=0)  # int8 vs fp32 bound (absolute, 0.005 = 0.5 points)
    calibration_batches: int = Field(8, ge=1)  # for the PTQ baseline
    # Op types the PTQ baseline quantizes; None = onnxruntime's default set. Transformers list only the
    # weight-bearing ops: quantizing BERT's attention-mask Add (input range -3.4e38..x) collapsed attention.
    ptq_op_types: list[str] | None = None

    def allows(self, drop: float) -> bool:
        """The int8 rule, for the trainer and `zoo validate` alike: an int8 file may lose at most max_accuracy_drop
        of fp32's accuracy."""
        return drop <= self.max_accuracy_drop + 1e-12


class Parallelism(Strict):
    # The parallel layout (zoo.layouts: one row each, naming the launcher that runs it; the launchers guide lists
    # what each does).
    strategy: Annotated[str, AfterValidator(OneOf(lambda: LAYOUTS, "parallelism strategy"))] = "ddp"
    micro_batch_size: int | None = Field(None, ge=1)  # per replica; gradient accumulation makes up the rest
    tensor_parallel_size: int = Field(2, ge=1)  # dp-tp: ranks per tensor-parallel group (tp: all ranks)
    pipeline_stages: int = Field(2, ge=2)  # pp-dp and ds-pp: stages per pipeline (pp: one stage per rank)
    pipeline_schedule: Literal["gpipe", "1f1b"] = "1f1b"  # torch.distributed.pipelining schedule
    # fsdp: free each block's gathered parameters after its forward (ZeRO-3: gathered again for backward) for "all"
    # blocks, "all-but-last" (backward starts with the last block: no free-and-gather-again; torchtitan's choice),
    # or "none" (keep them until backward: ZeRO-2 memory, one all-gather per step fewer).
    fsdp_reshard_after_forward: Literal["all", "all-but-last", "none"] = "all-but-last"
    # Merged over the DeepSpeed config generated from the recipe (e.g. {zero_optimization: {reduce_bucket_size: 5e6}}).
    deepspeed: dict = Field(default_factory=dict)


class Export(Strict):
    # The variant kinds the training run makes and measures (zoo.kinds: those with in_recipe); [] trains only: no
    # evaluation and no export (benchmark runs).
    variants: list[str] = ["fp32"]  # variant kinds the run exports and measures (zoo.kinds)
    opsets: list[int] = [17]  # ONNX opsets of the fp32 export; the first is the primary
    # Parameter-name globs on-device training may change, recorded in the fp32 file (zoo.trainable); None: all.
    # `zoo build` sets it from the card's `trainable` (the card is where an entry's split lives).
    trainable: list[str] | None = None

    @model_validator(mode="after")
    def _check(self) -> "Export":
        unknown = [v for v in self.variants if v not in recipe_kinds()]
        if unknown:
            raise ValueError(f"variants {unknown} unknown; a recipe exports: {', '.join(recipe_kinds())}")
        bad = [o for o in self.opsets if not 13 <= o <= 20]
        if bad:
            raise ValueError(f"opsets {bad} unsupported: per-channel QDQ needs >= 13, ORT 1.19 runs <= 20")
        return self


class Checkpoint(Strict):
    interval_steps: int = Field(0, ge=0)  # 0: no checkpoints


class Tracking(Strict):
    enabled: bool = True  # log params, metrics, files and the summary to MLflow (rank 0)
    experiment: str = "zoo"  # MLflow experiment name
    uri: str | None = None  # default: sqlite database under $ZOO_HOME


class Federated(Strict):
    """launchers/federated.py: FedAvg over clients that train the zoo's fp32 ONNX with onnxruntime-training."""

    clients: int = Field(3, ge=1)  # Flower clients in the fleet
    rounds: int = Field(5, ge=1)  # federated rounds
    local_steps: int = Field(20, ge=1)  # optimizer steps per client per round
    local_batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-3, gt=0)
    dirichlet_alpha: float = Field(0.5, gt=0)  # non-IID label skew of the client splits (smaller: more skewed)
    shift: str | None = None  # a distribution shift of the data the fleet sees (zoo.ondevice.SHIFTS)
    round_timeout_s: float = Field(120.0, gt=0)  # a client this far behind the round's first update is dropped
    min_clients: int = Field(1, ge=1)  # fewer updates than this: the global model is kept for the round


class Recipe(Strict):
    name: str
    description: str = ""
    model: str
    model_args: dict[str, str | int | float | bool] = Field(default_factory=dict)  # builder keyword arguments
    # Where training starts: a state dict (.pt, e.g. an imported upstream checkpoint's, as `zoo import` converts it) or
    # a published zoo file named by content ({entry, variant, sha256, size}: its fp32 ONNX initializers), fetched
    # like `zoo fetch` fetches it, else from the repository's store as an earlier commit held it.
    init_from: str | PublishedFile | None = None
    trainable: list[str] | None = None  # parameter-name globs to train (others frozen); None: all
    dataset: str | None = None  # default: the model's own dataset
    # Training-split augmentations (zoo.data.shifts.AUGMENTATIONS), e.g. [pixel-shifts]: the images and their eight
    # one-pixel translations.
    augment: list[Literal["pixel-shifts"]] = Field(default_factory=list)
    optimizer: Optimizer = Optimizer()
    schedule: Schedule = Schedule()
    epochs: float | None = Field(None, gt=0)  # training length in passes over the training split (or steps)
    steps: int | None = Field(None, ge=1)  # training length in optimizer steps (or epochs)
    global_batch_size: int = Field(64, ge=1)  # examples per optimizer step over all ranks (kept whatever the layout)
    # Text datasets (their padding_id): each epoch's global batches hold texts of similar length, cut to the longest;
    # the same examples, less padding computed (langid: ~3x fewer tokens a step). Pipeline layouts refuse it.
    group_by_length: bool = False
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # training compute precision (autocast / FSDP policy)
    quantization: Quantization = Quantization()
    parallelism: Parallelism = Parallelism()
    backend: Literal["auto", "gloo", "nccl", "ccl"] = "auto"  # auto: NCCL with GPUs, else gloo; ccl needs oneCCL
    export: Export = Export()
    seed: int = 0
    checkpoint: Checkpoint = Checkpoint()
    tracking: Tracking = Tracking()
    eval_split: Literal["val", "test"] = "test"
    # Measure the models on this many examples of the eval split, spread evenly over it (zoo.data.base.Dataset.split),
    # not all of it: quick runs whose accuracy is not the point. None: the whole split, as cards are measured
    # (`zoo build` refuses a recipe that sets it).
    eval_examples: int | None = Field(None, ge=1)
    federated: Federated | None = None

    @model_validator(mode="after")
    def _length(self) -> "Recipe":
        if self.federated is None and (self.epochs is None) == (self.steps is None):
            raise ValueError("set exactly one of 'epochs' and 'steps'")
        for kind in [KINDS[key] for key in self.export.variants if KINDS[key].training]:
            if kind.training.scheme != self.quantization.scheme:
                raise ValueError(f"export.variants: {kind.key} needs quantization.scheme: {kind.training.scheme}")
        return self

    def digest(self) -> str:
        """sha256 of the resolved recipe (after overrides): what exported files record. Starting weights
        (`init_from`) count by their content, not by where this machine keeps them, so a rebuild elsewhere (another
        $ZOO_HOME) of the same recipe from the same weights records the same digest."""
        data = self.model_dump(mode="json")
        if isinstance(self.init_from, str) and Path(self.init_from).is_file():
            data["init_from"] = "sha256:" + sha256_file(Path(self.init_from))
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def recipe_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    candidate = RECIPES_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    known = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
    raise ZooError(f"unknown recipe '{name_or_path}'; known recipes: {known} (or pass a path to a .yaml file)")


def _set_dotted(data: dict, key: str, value: object, source: str) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise CardError(f"{source}: override '{key}': '{part}' is not a section")
    node[parts[-1]] = value


def load_recipe(name_or_path: str, overrides: list[str] | None = None, **fields: object) -> Recipe:
    """The recipe, with `key=value` overrides (dotted keys, YAML values) and explicit fields applied."""
    path = recipe_path(name_or_path)
    data = read_yaml(path) or {}
    if not isinstance(data, dict):
        raise CardError(f"{path}: the top level must be a mapping of recipe fields (name, model, ...), "
                        f"not a {type(data).__name__}")
    overridden = set()
    for item in overrides or []:
        if "=" not in item:
            raise CardError(f"{path}: override '{item}' must look like key=value (e.g. optimizer.lr=0.01)")
        key, raw = item.split("=", 1)
        overridden.add(key.strip())
        _set_dotted(data, key.strip(), yaml.safe_load(raw), str(path))
    # Training length is one choice: overriding steps replaces the recipe's epochs, and vice versa.
    for given, other in (("steps", "epochs"), ("epochs", "steps")):
        if given in overridden and other not in overridden:
            data.pop(other, None)
    for key, value in fields.items():
        if value is not None:
            _set_dotted(data, key, value, str(path))
    return validate_file_data(Recipe, data, str(path))


def entry_training_command(recipe: str, architecture: str, nproc: int = 2, trainable: list[str] | None = None,
                           init_from: str | None = None) -> list[str]:
    """The torchrun command `zoo build` runs for an entry (and `zoo fetch --build` runs again at the card's commit):
    the ddp launcher, the card's recipe and architecture, its on-device split (`export.trainable`, recorded in the fp32
    file's metadata) and, for an imported entry, the converted upstream weights it starts from (`init_from`)."""
    command = ["torchrun", "--standalone", f"--nproc_per_node={nproc}", "launchers/ddp.py", "--recipe", recipe,
               "--model", architecture]
    if init_from is not None:
        command.append(f"init_from={init_from}")
    if trainable and trainable != ["*"]:
        command.append(f"export.trainable={json.dumps(trainable, separators=(',', ':'))}")
    return command


def import_command(name: str, nproc: int | None = None) -> str:
    """`zoo import`'s command for an entry, the upstream checkpoint's folder left for the user to fill in; with `nproc`,
    as a card records it (command_processes reads the count back)."""
    return f"zoo import {name} --from <checkpoint dir>" + (f" --nproc {nproc}" if nproc is not None else "")


def command_processes(command: str | None) -> int:
    """The training processes of a card's recorded command, which `zoo fetch --build` and `zoo reproduce` run again
    (another count trains other bytes): torchrun's --nproc_per_node (1 when it names none, torchrun's default), or
    `zoo import`'s --nproc (2 when it names none: the cards `zoo import` wrote before it recorded the count)."""
    words = shlex.split(command or "")
    option, default = ("--nproc", 2) if words[:2] == ["zoo", "import"] else ("--nproc_per_node", 1)
    for i, word in enumerate(words):
        if word == option and i + 1 < len(words) and words[i + 1].isdigit():
            return int(words[i + 1])
        if word.startswith(f"{option}=") and word.split("=", 1)[1].isdigit():
            return int(word.split("=", 1)[1])
    return default
