"""The catalog in MLflow's model registry: every built ONNX variant of an entry a version of `zoo.NAME`.

Each version is made with MLflow's ONNX flavor from the verified file (fetched through the stores like any
`zoo fetch`), so `mlflow.pyfunc.load_model("models:/zoo.NAME@int8-qat")` runs it in onnxruntime. The card travels
with it: tags (sha256, accuracy and its 95% interval, tolerance, CPU, recipe, commit, precision, quantization), the
signature and an input example from the entry's test data. Aliases name the variants (`fp32`, `int8-qat`, ...) and
`fastest` the card's fastest variant within tolerance. A version is identified by its file's sha256, so registering
twice adds nothing; an alias already pointing at another sha256 is reported and left alone unless asked to move.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
import numpy as np
import onnx
from mlflow.models import infer_signature
from mlflow.tracking import MlflowClient

from zoo import catalog
from zoo.cards import ModelCard
from zoo.errors import ZooError
from zoo.metrics import wilson_interval
from zoo.store.fetch import fetch, fetch_object
from zoo.pointer import pointer_for, read_pointer, sha256_file
from zoo.train.tracking import default_tracking_uri, experiment_id
from zoo.variants.checks import load_test_sets
from zoo.kinds import kind_of

PREFIX = "zoo."
SHA_TAG = "zoo.sha256"
EXPERIMENT = "zoo-registry"  # where `zoo register` keeps the logged models it registers (no training run)
EXAMPLE_ROWS = 2  # rows of the test inputs stored as each version's input example


def model_name(entry: str) -> str:
    return f"{PREFIX}{entry}"


def model_uri(entry: str, alias: str) -> str:
    return f"models:/{model_name(entry)}@{alias}"


@dataclass
class Registered:
    variant: str
    version: str
    sha256: str
    new: bool  # False: a version with this file's sha256 was already there
    aliases: list[str] = field(default_factory=list)  # set (or already right) by this call
    conflicts: list[str] = field(default_factory=list)  # aliases left on a version holding another file


def reference_data(card: ModelCard) -> tuple[np.ndarray, np.ndarray]:
    """The first test set's inputs and fp32 reference outputs, fetched and verified like the model files."""
    entry = catalog.get_entry(card.name)
    pbs = sorted(entry.dir.glob("test_data_set_0/*.pb"))
    if not pbs:
        raise ZooError(f"'{card.name}' has no test_data_set_0: `zoo build {card.name}` writes it")
    with tempfile.TemporaryDirectory(prefix="zoo-register-") as tmp:
        folder = Path(tmp) / "test_data_set_0"
        folder.mkdir()
        for path in pbs:
            pointer = read_pointer(path) or pointer_for(path)
            found = fetch_object(pointer, f"{card.name}/test_data_set_0/{path.name}", checkout_path=path,
                                 show_progress=False)
            (folder / path.name).write_bytes(Path(found.path).read_bytes())
        return load_test_sets(Path(tmp))[0]


def _tags(card: ModelCard, key: str) -> dict[str, str]:
    v = card.variants[key]
    tags = {SHA_TAG: v.sha256, "zoo.size": str(v.size), "zoo.variant": key, "zoo.file": v.file,
            "zoo.precision": v.precision, "zoo.quantization": v.quantization, "zoo.opset": str(v.opset),
            "zoo.tolerance": str(v.tolerance), "zoo.recipe": card.training.recipe or "",
            "zoo.git_commit": card.training.git_commit or "", "zoo.threads": str(card.training.threads or "")}
    if card.training.cpu:
        tags["zoo.cpu"] = card.training.cpu.model
    metric = v.metrics.get(card.primary_metric)
    tested = card.dataset.splits.get("test")
    if metric is not None:
        tags[f"zoo.{card.primary_metric}"] = f"{metric:.6g}"
        if tested and kind_of(key, v).reference != "retrained":
            low, high = wilson_interval(metric, tested)
            tags[f"zoo.{card.primary_metric}_ci95"] = f"[{low:.4f}, {high:.4f}] ({tested:,} test examples)"
    return tags


def _description(card: ModelCard, key: str) -> str:
    v = card.variants[key]
    metric = v.metrics.get(card.primary_metric)
    measured = f"{card.primary_metric} {metric:.4f} on the card's test split" if metric is not None else "not measured"
    return (f"{card.name} {key}: {kind_of(key, v).summary}. {measured} (tolerance {v.tolerance}); sha256 {v.sha256}. "
            f"Card: zoo card {card.name}")


def register(name: str, tracking_uri: str | None = None, variants: list[str] | None = None,
             run_id: str | None = None, move_aliases: bool = False, log=print) -> list[Registered]:
    """Register the entry's built ONNX variants (all, or `variants`) as versions of `zoo.NAME`. `run_id`: the
    training run that made the files (the version's lineage); without it the models are logged in the experiment
    `zoo-registry`. Returns what each variant got; aliases held by another file are in `conflicts`."""
    card = catalog.get_card(name)
    chosen = card.registrable_variants(variants)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # our own log says what happens
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # registering a file is no reason to phone out
    logging.getLogger("mlflow").setLevel(logging.WARNING)  # its "Created version ..." repeats ours
    uri = tracking_uri or default_tracking_uri()
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    registered_name = model_name(name)
    if client.search_registered_models(filter_string=f"name = '{registered_name}'") == []:
        client.create_registered_model(registered_name, description=card.description, tags={
            "zoo.task": card.task, "zoo.family": card.family, "zoo.license": card.license,
            "zoo.dataset": card.dataset.name, "zoo.primary_metric": card.primary_metric})
    by_sha = {mv.tags.get(SHA_TAG): mv for mv in client.search_model_versions(f"name = '{registered_name}'")}
    inputs, outputs = reference_data(card)
    example = {card.inputs[0].name: inputs[:EXAMPLE_ROWS]}
    signature = infer_signature(example, {card.outputs[0].name: outputs[:EXAMPLE_ROWS]})
    fastest = card.fastest(1) if card.variants["fp32"].speed else None
    # What serving needs, from the versions that measured the card (MLflow would otherwise infer them by importing
    # the model in a subprocess: ~7 s a version).
    versions = card.training.library_versions
    requirements = [f"{package}>={versions[package]}" if package in versions else package
                    for package in ("onnx", "onnxruntime")]
    results = []
    if run_id is None:  # no training run: the logged models live in the registry's own experiment
        mlflow.set_experiment(experiment_id=experiment_id(client, uri, EXPERIMENT))
    for key in chosen:
        sha = card.variants[key].sha256
        existing = by_sha.get(sha)
        if existing is not None:
            results.append(Registered(key, existing.version, sha, new=False))
            log(f"[{name}] {key}: already version {existing.version} of {registered_name} (sha256 {sha[:12]})")
            continue
        path = fetch(name, key, show_progress=False).path
        model = onnx.load(str(path), load_external_data=False)
        # MLflow prints a link to the run on stdout when the run ends: stdout is the command's answer (--json).
        with contextlib.redirect_stdout(sys.stderr), \
                mlflow.start_run(run_id=run_id, run_name=None if run_id else f"register {name} {key}"):
            info = mlflow.onnx.log_model(model, name=f"{name}-{key}", signature=signature, input_example=example,
                                         save_as_external_data=False, registered_model_name=registered_name,
                                         pip_requirements=requirements)
        version = info.registered_model_version
        mv = client.get_model_version(registered_name, str(version))
        written = _artifact_sha256(client, registered_name, mv.version)
        if written != sha:  # what MLflow stored must be the card's bytes, or the tags would describe another file
            client.delete_model_version(registered_name, mv.version)
            raise ZooError(f"{registered_name} {key}: MLflow stored other bytes (sha256 {written[:12]}) than the "
                           f"card's file ({sha[:12]}); the version was removed")
        for tag, value in _tags(card, key).items():
            client.set_model_version_tag(registered_name, mv.version, tag, value)
        client.update_model_version(registered_name, mv.version, description=_description(card, key))
        by_sha[sha] = mv
        results.append(Registered(key, mv.version, sha, new=True))
        log(f"[{name}] {key}: registered version {mv.version} of {registered_name}")
    wanted = {r.variant: r for r in results}
    aliases = {key: key for key in wanted}
    if fastest in wanted:
        aliases["fastest"] = fastest
    current = client.get_registered_model(registered_name).aliases or {}
    for alias, key in aliases.items():
        mine = wanted[key]
        holder = current.get(alias)
        if holder is not None and str(holder) != str(mine.version):
            held = client.get_model_version(registered_name, str(holder)).tags.get(SHA_TAG)
            if held != mine.sha256 and not move_aliases:
                mine.conflicts.append(f"{registered_name}@{alias} is version {holder} (sha256 {str(held)[:12]}), "
                                      f"not this card's {key} (version {mine.version}, sha256 {mine.sha256[:12]})")
                continue
        if str(holder) != str(mine.version):
            client.set_registered_model_alias(registered_name, alias, mine.version)
        mine.aliases.append(alias)
    return results


def _artifact_sha256(client, registered_name: str, version: str) -> str:
    """sha256 of the model.onnx a registered version serves (downloaded from its artifact store)."""
    source = client.get_model_version_download_uri(registered_name, version)
    with tempfile.TemporaryDirectory(prefix="zoo-register-") as tmp:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=tmp))
        files = sorted(local.rglob("*.onnx"))
        if len(files) != 1:
            raise ZooError(f"{registered_name} version {version}: expected one .onnx file, found {len(files)}")
        return sha256_file(files[0])
