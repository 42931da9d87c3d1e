"""The trainer through its real launchers: torchrun multi-process, QAT int8 in onnxruntime, restarts (MLflow: test_mlflow)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import REPO, all_cpus, failed_run, wall_limit
from zoo.errors import ZooError
from zoo.evaluate import INT8_KERNELS, kernel_types
from zoo.metadata import DATASET_KEYS, FP32_ONLY_KEYS, METADATA_KEYS, RETRAINED_KEYS, read_metadata
from zoo.pointer import sha256_file
from zoo.recipes import load_recipe
from zoo.train import trainer
from zoo.train.distributed import DistContext
from zoo.train.arguments import parse_args
from zoo.train.launch import prepare

LAUNCHER = str(REPO / "launchers" / "ddp.py")
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
QUICK = ["steps=24", "quantization.scheme=none", "export.variants=[fp32]", "export.opsets=[17]"]


def _env(tmp_path: Path, **extra) -> dict:
    return {**os.environ, "ZOO_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1", **extra}


def train(tmp_path: Path, out: str, *args: str, nproc: int | None = None, extra_env: dict | None = None,
          torchrun_args: tuple = (), check: bool = True) -> subprocess.CompletedProcess:
    if nproc is None:
        cmd = [sys.executable, LAUNCHER]
    else:
        cmd = [TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", *torchrun_args, LAUNCHER]
    cmd += ["--output-dir", str(tmp_path / out), *args]
    with all_cpus() if nproc else contextlib.nullcontext():  # ranks: both CPUs (tests/helpers.py)
        result = subprocess.run(cmd, capture_output=True, text=True, env=_env(tmp_path, **(extra_env or {})),
                                timeout=wall_limit(600), cwd=tmp_path)
    if check and result.returncode != 0:
        raise AssertionError(failed_run(cmd, result.stdout, result.stderr))
    return result


def _state(tmp_path: Path, out: str) -> dict:
    return torch.load(tmp_path / out / "model.pt")


def _max_rel_diff(a: dict, b: dict) -> float:
    return max(float(((a[k] - b[k]).abs() / (b[k].abs() + 1e-8)).max()) if a[k].is_floating_point() else 0.0 for k in a)


@pytest.mark.ranks  # it takes both CPUs itself (tests/helpers.py all_cpus)
def test_two_processes_match_one(tmp_path):
    train(tmp_path, "one", "--recipe", "fp32", "--no-tracking", *QUICK)
    # One job, two cells: each replica's 32 examples of the global batch at once, and with gradient accumulation
    # (micro-batches of 8); both give the 1-process model.
    train(tmp_path, "two", "--recipe", "fp32", "--no-tracking", *QUICK, "--sweep", "parallelism.micro_batch_size=32,8",
          nproc=2)
    one = _state(tmp_path, "one")
    for cell in ("two/32", "two/8"):
        two = _state(tmp_path, cell)
        assert set(one) == set(two)
        assert max(float((one[k] - two[k]).abs().max()) for k in one) <= 1e-5, cell
        summary = json.loads((tmp_path / cell / "summary.json").read_text())
        assert summary["world_size"] == 2 and summary["backend"] == "gloo"
        assert summary["phases"]["fp32"]["final_loss"] < summary["phases"]["fp32"]["first_loss"]


@pytest.mark.ranks  # it takes both CPUs itself (tests/helpers.py all_cpus)
def test_qat_int8_runs_int8_kernels_within_bound(tmp_path):
    result = train(tmp_path, "qat", "--recipe", "qat-int8", "--no-tracking", "quantization.qat_steps=40", nproc=2)
    summary = json.loads((tmp_path / "qat" / "summary.json").read_text())
    variants = summary["variants"]
    assert set(variants) == {"fp32", "int8-qat", "int8-ptq", "int8-dynamic", "fp16"}
    qat = tmp_path / "qat" / variants["int8-qat"]["file"]
    for key in ("int8-qat", "int8-dynamic"):
        assert kernel_types(tmp_path / "qat" / variants[key]["file"]) & INT8_KERNELS, f"{key} must run int8 kernels"
    assert variants["int8-qat"]["within_bound"], variants
    assert variants["fp32"]["accuracy"] > 0.9
    assert variants["fp32"]["extra_opsets"]["13"]["agreement_with_primary"] == 1.0
    fp32 = tmp_path / "qat" / "model.onnx"
    meta = read_metadata(qat)
    assert set(METADATA_KEYS) - FP32_ONLY_KEYS - RETRAINED_KEYS - DATASET_KEYS <= set(meta)
    assert not DATASET_KEYS & set(meta)  # an image model carries no tokenizer
    assert FP32_ONLY_KEYS <= set(read_metadata(fp32))  # what on-device training may change
    assert meta["zoo.source_sha256"] == sha256_file(fp32)
    assert meta["zoo.precision.accumulation"] == "int32" and meta["zoo.recipe"] == "qat-int8"
    assert read_metadata(fp32)["zoo.precision.compute"] == "fp32"
    assert "loss" in result.stderr  # rank 0's progress bar


@pytest.mark.ranks  # it takes both CPUs itself (tests/helpers.py all_cpus)
def test_killed_rank_restarts_and_resumes_to_same_weights(tmp_path):
    args = ["--recipe", "fp32", "--no-tracking", *QUICK, "checkpoint.interval_steps=5"]
    train(tmp_path, "clean", *args, nproc=2)
    crashed = train(tmp_path, "crashed", *args, nproc=2, torchrun_args=("--max-restarts", "1"),
                    extra_env={"ZOO_TEST_FAULT": "train-step@1:12"})
    assert "resumed from the checkpoint at step 10" in crashed.stdout + crashed.stderr
    clean, resumed = _state(tmp_path, "clean"), _state(tmp_path, "crashed")
    assert all(torch.equal(clean[k], resumed[k]) for k in clean)
    # the loss curve survives the restart: steps before it come from the checkpoint folder, so it is the clean run's
    losses = {run: json.loads((tmp_path / run / "summary.json").read_text())["phases"]["fp32"]["losses"]
              for run in ("clean", "crashed")}
    assert len(losses["crashed"]) == 24 and losses["crashed"] == losses["clean"]
    # --resume after a finished run trains nothing more and lands on the same weights
    again = train(tmp_path, "crashed", *args, "--resume", nproc=2)
    assert "resumed from the checkpoint at step 24" in again.stdout + again.stderr
    assert all(torch.equal(clean[k], _state(tmp_path, "crashed")[k]) for k in clean)


def test_same_seed_same_threads_same_onnx_bytes(tmp_path):
    train(tmp_path, "a", "--recipe", "fp32", "--no-tracking", *QUICK)
    train(tmp_path, "b", "--recipe", "fp32", "--no-tracking", *QUICK)
    assert sha256_file(tmp_path / "a" / "model.onnx") == sha256_file(tmp_path / "b" / "model.onnx")


@pytest.mark.parametrize("args, message", [
    (["--recipe", "fp32", "optimzer.lr=0.1"], "recipes/fp32.yaml: optimzer: unknown field"),
    (["--recipe", "fp32", "precision=fp8"], "precision: Input should be 'fp32', 'bf16' or 'fp16'"),
    (["--recipe", "nope"], "unknown recipe 'nope'; known recipes:"),
    (["--recipe", "fp32", "--model", "digits-cnm"], "unknown model 'digits-cnm'; did you mean: digits-cnn?"),
    (["--recipe", "fp32", "--backend", "ccl"], "backend ccl needs Intel's oneCCL binding: install oneccl_bindings_for_pytorch"),
    (["--recipe", "fp32", "group_by_length=true"],
     "recipe 'fp32': group_by_length needs text padded at the end, and the digits dataset's inputs have one fixed shape"),
])
def test_bad_input_fails_with_its_message(tmp_path, args, message):
    result = train(tmp_path, "bad", *args, check=False)
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "bad").exists()




def test_group_by_length_trains_on_batches_cut_to_their_longest_text(tmp_path, monkeypatch):
    """group_by_length on the language-ID data: every fp32 micro-batch the trainer hands the layout is cut to its
    longest text (short texts: far fewer than the 64 columns the data is padded to); a pipeline layout, whose stages
    exchange one shape, refuses it before any process group exists. (The QAT phase keeps whole rows: the family test
    trains bert-tiny's QAT phase after a grouped fp32 phase.)"""
    widths = []

    def spy(x, padding_id):
        cut = cut_padding(x, padding_id)
        widths.append((x.shape[1], cut.shape[1], int((cut != padding_id).any(0)[-1])))
        return cut

    cut_padding = trainer.cut_padding
    monkeypatch.setattr(trainer, "cut_padding", spy)
    recipe = load_recipe("fp32", ["steps=6", "epochs=null", "global_batch_size=32", "parallelism.micro_batch_size=16",
                                  "group_by_length=true", "export.variants=[]", "tracking.enabled=false",
                                  "checkpoint.interval_steps=0"], model="bert-tiny")
    try:
        summary = trainer.run(recipe, DistContext(), output_dir=tmp_path)
    finally:
        torch.use_deterministic_algorithms(False)
    assert len(widths) == 6 * 2 and all(full == 64 and last == 1 for full, _, last in widths)  # the last column is real
    assert sum(cut for _, cut, _ in widths) < 0.6 * 64 * len(widths), widths
    assert len(summary.phases["fp32"].losses) == 6
    with pytest.raises(ZooError, match="group_by_length gives batches of other widths, and "
                                       "parallelism.strategy=pp's pipeline stages exchange one shape"):
        prepare("pipeline", parse_args(["--recipe", "fp32", "--model", "bert-tiny", "group_by_length=true"]))
