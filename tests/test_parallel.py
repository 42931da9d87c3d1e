"""Every launcher and parallel layout against a 1-process run of the same recipe and global batch.

Real processes throughout: torchrun (gloo), the `deepspeed` launcher, horovodrun, and torchrun across
two network namespaces joined by a veth pair (two "hosts" on one machine). SGD keeps the comparison
meaningful: Adam turns float noise in parameters whose gradient is analytically zero (attention key
biases) into full learning-rate steps.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import REPO, failed_run, free_port, made_once, side_by_side

BIN = Path(sys.executable).parent
SGD = ["optimizer.name=sgd", "optimizer.lr=0.05", "quantization.scheme=none", "export.variants=[fp32]",
       "export.opsets=[17]", "--no-tracking"]
CNN = ["--recipe", "fp32", "--model", "digits-cnn", "steps=16", *SGD]
# A small BERT without dropout (dropout draws differ between layouts), 2 heads so tensor parallel splits them.
BERT = ["--model", "bert", "steps=6", *SGD, "model_args.num_hidden_layers=2", "model_args.hidden_size=64",
        "model_args.num_attention_heads=2", "model_args.intermediate_size=128", "model_args.hidden_dropout_prob=0",
        "model_args.attention_probs_dropout_prob=0", "eval_examples=512"]
QAT = ["--recipe", "qat-int8", "--no-tracking", "steps=20", "quantization.qat_steps=16",
       "export.variants=[fp32,int8-qat]", "export.opsets=[17]"]
TOLERANCE = 1e-5  # per tensor: |a - b| / |a| (norms)
ranks = pytest.mark.usefixtures("whole_machine")  # a test that runs ranks takes both CPUs (tests/helpers.py)


def env(tmp_path: Path, **extra) -> dict:
    return {**os.environ, "ZOO_HOME": str(tmp_path.parent / "zoo-home"), "OMP_NUM_THREADS": "1",
            "HOROVOD_GLOO_IFACE": "lo", **extra}


def succeeded(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    if result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}: {failed_run(result.args, result.stdout, result.stderr)}")
    return result


def run(cmd: list[str], tmp_path: Path, timeout: int = 600, **extra) -> subprocess.CompletedProcess:
    return succeeded(subprocess.run(cmd, capture_output=True, text=True, env=env(tmp_path, **extra), timeout=timeout,
                                    cwd=tmp_path))


def run_together(tmp_path: Path, *jobs: tuple[list[str], dict]) -> list[subprocess.CompletedProcess]:
    """Independent jobs of one test (command, extra environment) side by side (tests/helpers.py side_by_side)."""
    return [succeeded(r) for r in side_by_side(*[(cmd, env(tmp_path, **extra), tmp_path) for cmd, extra in jobs])]


def torchrun(launcher: str, nproc: int, out: Path, *args: str) -> list[str]:
    return [str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={nproc}", str(REPO / "launchers" / launcher),
            "--output-dir", str(out), *args]


def single(out: Path, *args: str) -> list[str]:
    return [sys.executable, str(REPO / "launchers" / "ddp.py"), "--output-dir", str(out), *args]


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def worst_difference(a: Path, b: Path) -> float:
    one, other = torch.load(a / "model.pt"), torch.load(b / "model.pt")
    assert set(one) == set(other)
    return max(float((one[k] - other[k]).norm() / one[k].norm().clamp(min=1e-12)) for k in one)


def check_same_model(reference: Path, out: Path, world_size: int, strategy: str) -> None:
    got, ref = summary(out), summary(reference)
    assert got["world_size"] == world_size and got["strategy"] == strategy
    assert worst_difference(reference, out) <= TOLERANCE
    phase = got["phases"]["fp32"]
    assert phase["final_loss"] < phase["first_loss"]
    assert phase["ranks_consistent"] is True
    # same data, same weights: the exported ONNX scores the same accuracy in onnxruntime
    assert got["variants"]["fp32"]["accuracy"] == pytest.approx(ref["variants"]["fp32"]["accuracy"], abs=1e-9)


# The one-process runs every layout is compared with, made once per test run (tests/helpers.py made_once): in the
# single-process part of `make test` (test_the_one_process_references_train_and_export), so the tests that hold both
# CPUs only read them.
@pytest.fixture(scope="module")
def cnn_reference() -> Path:
    return made_once("parallel-cnn-reference", lambda folder: run(single(folder / "out", *CNN), folder)) / "out"


@pytest.fixture(scope="module")
def bert_reference() -> Path:
    def make(folder: Path) -> None:
        run(single(folder / "out", "--recipe", "dp-tp", *BERT, "parallelism.strategy=ddp"), folder)

    return made_once("parallel-bert-reference", make) / "out"


@pytest.fixture(scope="module")
def qat_reference() -> Path:
    return made_once("parallel-qat-reference", lambda folder: run(single(folder / "out", *QAT), folder)) / "out"


def test_the_one_process_references_train_and_export(cnn_reference, bert_reference, qat_reference):
    for out in (cnn_reference, bert_reference, qat_reference):
        got = summary(out)
        assert got["world_size"] == 1 and (out / "model.pt").is_file() and (out / "model.onnx").is_file()
        phase = got["phases"]["fp32"]
        assert phase["final_loss"] < phase["first_loss"] and got["variants"]["fp32"]["accuracy"] > 0
    assert list(summary(qat_reference)["phases"]) == ["fp32", "qat"] and (qat_reference / "model.int8-qat.onnx").is_file()


@ranks
@pytest.mark.parametrize("launcher,strategy,extra", [
    # beyond the matrix below: gradient accumulation under ZeRO, and the other pipeline schedule
    ("deepspeed.py", "zero2", ["parallelism.micro_batch_size=16"]),
    ("pipeline.py", "pp", ["parallelism.pipeline_schedule=gpipe"]),
])
def test_launcher_matches_one_process(tmp_path, cnn_reference, launcher, strategy, extra):
    run(torchrun(launcher, 2, tmp_path / "out", *CNN, f"parallelism.strategy={strategy}", *extra), tmp_path)
    check_same_model(cnn_reference, tmp_path / "out", 2, strategy)


def matrix_groups() -> list[tuple[str, tuple[str, ...], int]]:
    """The support matrix (zoo.train.parallel.support_matrix) as one job per launcher and process count: each job
    runs all its cells (strategy x recipe x precision) in one process start (the launchers' --sweep)."""
    from zoo.train.parallel import support_matrix

    groups: dict[tuple[str, int], list[str]] = {}
    for launcher, strategy, processes, _, _ in support_matrix():
        groups.setdefault((launcher, processes), []).append(strategy)
    return [(launcher, tuple(strategies), processes) for (launcher, processes), strategies in groups.items()]


@ranks
@pytest.mark.parametrize("launcher,strategies,processes", matrix_groups())
def test_every_launcher_runs_every_precision_with_and_without_qat(tmp_path, cnn_reference, launcher, strategies,
                                                                     processes):
    """Each cell finishes, every rank ends with the same weights, the recipe's variants are exported (int8-qat with
    QAT) and, in fp32, the fp32 phase trained the same model as one process.

    A `+ qat-int8` cell's first phase is its plain cell (the same recipe, steps and weights; model.pt and model.onnx are
    that phase's): the ddp job runs both and asserts they are equal byte for byte, the other jobs run the QAT cells
    only, their fp32 phases standing for the plain cells. The DeepSpeed job runs under DeepSpeed's own launcher (the
    other DeepSpeed tests run it under torchrun)."""
    import onnx

    from zoo.recipes import load_recipe
    from zoo.train.parallel import support_matrix, unsupported_here

    rows = {strategy: (precisions, schemes) for _, strategy, _, precisions, schemes in support_matrix()}
    schemes = rows[strategies[0]][1]
    plain_cells = launcher == "ddp"  # elsewhere the QAT cells' fp32 phases are the plain cells (docstring)
    swept = [s for s in schemes if plain_cells or s != "none"]
    # A cell this machine cannot run (zoo.train.parallel.unsupported_here) must be refused at the recipe check.
    refused = [(s, p) for s in strategies for p in rows[s][0] if unsupported_here(s, p)]
    for strategy, precision in refused:
        result = subprocess.run([sys.executable, str(REPO / "launchers" / f"{launcher}.py"), "--recipe", "fp32",
                                 f"parallelism.strategy={strategy}", f"precision={precision}", "--output-dir",
                                 str(tmp_path / "refused")], capture_output=True, text=True, env=env(tmp_path),
                                cwd=tmp_path, timeout=300)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.strip().startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
        assert f"use precision=bf16 with {strategy}" in result.stderr and not (tmp_path / "refused").exists()
    precisions = [p for p in rows[strategies[0]][0] if not any(unsupported_here(s, p) for s in strategies)]
    # The user's recipes for each quantization scheme, exporting only what the layout can change: fp32 (and int8-qat
    # with QAT). The variants made from the fp32 file (int8-ptq, int8-dynamic, fp16) do not depend on how it was
    # trained; tests/test_families.py makes and measures them.
    recipes = {}
    for scheme, name in {"none": "fp32", "qat-int8": "qat-int8"}.items():
        data = yaml.safe_load((REPO / "recipes" / f"{name}.yaml").read_text())
        data["export"]["variants"] = ["fp32"] + (["int8-qat"] if scheme == "qat-int8" else [])
        recipes[scheme] = tmp_path / "recipes" / f"{name}.yaml"  # cells keep the recipe's name: <strategy>_<name>_...
        recipes[scheme].parent.mkdir(exist_ok=True)
        recipes[scheme].write_text(yaml.safe_dump(data))
    sweep = ["--sweep", f"parallelism.strategy={','.join(strategies)}",
             "--sweep", f"recipe={','.join(str(recipes[s]) for s in swept)}",
             "--sweep", f"precision={','.join(precisions)}"]
    args = ["--model", "digits-cnn", "steps=16", "optimizer.name=sgd", "optimizer.lr=0.05", "quantization.qat_steps=4",
            "export.opsets=[17]", "--no-tracking", *sweep]
    out = tmp_path / "out"
    if launcher == "horovod":
        run([str(BIN / "horovodrun"), "-np", str(processes), "-H", f"localhost:{processes}", "--gloo", sys.executable,
             str(REPO / "launchers" / "horovod.py"), "--output-dir", str(out), *args], tmp_path)
    elif launcher == "deepspeed":  # DeepSpeed's own launcher (not torchrun): it passes --local_rank
        run([str(BIN / "deepspeed"), "--num_gpus", str(processes), "--master_port", str(free_port()),
             str(REPO / "launchers" / "deepspeed.py"), "--output-dir", str(out), *args], tmp_path)
    else:
        run(torchrun(f"{launcher}.py", processes, out, *args), tmp_path)
    cells = json.loads((out / "sweep.json").read_text())["cells"]
    expected = [f"{s}_{r}_{p}" for s in strategies for r in (recipes[q].stem for q in swept) for p in precisions]
    assert [c["cell"] for c in cells] == expected
    if plain_cells:
        for strategy in strategies:
            for precision in precisions:
                plain, qat = out / f"{strategy}_fp32_{precision}", out / f"{strategy}_qat-int8_{precision}"
                assert (plain / "model.pt").read_bytes() == (qat / "model.pt").read_bytes(), plain
                # the same graph and weights (the metadata names the recipe the file came from)
                assert onnx.load(plain / "model.onnx").graph == onnx.load(qat / "model.onnx").graph, plain
    for cell in cells:
        got = summary(out / cell["cell"])
        recipe = load_recipe(cell["overrides"]["recipe"])  # the recipe file the cell ran
        assert got["strategy"] == cell["strategy"] == cell["overrides"]["parallelism.strategy"], cell
        assert got["world_size"] == processes, cell
        assert set(got["variants"]) == set(recipe.export.variants), cell
        phases = ["fp32", "qat"] if recipe.quantization.scheme == "qat-int8" else ["fp32"]
        assert list(got["phases"]) == phases, cell
        for phase in phases:
            assert got["phases"][phase]["ranks_consistent"] is True, (cell, phase)
            assert all(math.isfinite(loss) for loss in got["phases"][phase]["losses"]), (cell, phase)
        if cell["overrides"]["precision"] == "fp32":
            check_same_model(cnn_reference, out / cell["cell"], processes, cell["strategy"])
        if cell["strategy"].startswith("zero"):  # the config the launcher wrote: the layout's stage, the global batch
            config = json.loads((out / cell["cell"] / "deepspeed_config.json").read_text())
            assert config["zero_optimization"]["stage"] == int(cell["strategy"][-1]), cell
            assert config["train_batch_size"] == 64, cell
        else:
            loss = got["phases"]["fp32"]
            assert loss["final_loss"] < loss["first_loss"], cell


def test_the_launchers_guide_shows_the_layouts_table_and_the_matrix():
    from zoo.layouts import launchers_table
    from zoo.train.parallel import matrix_markdown

    guide = (REPO / "docs" / "guides" / "launchers.md").read_text()
    assert matrix_markdown() in guide, "the launchers guide's launcher matrix is stale: `zoo manifest` rewrites it"
    assert launchers_table() in guide, "the launchers guide's table is stale: `zoo manifest` rewrites it"


@ranks
@pytest.mark.parametrize("launcher,recipe,nproc,strategy", [
    ("tensor_parallel.py", "dp-tp", 2, "tp"),
    ("tensor_parallel.py", "dp-tp", 4, "dp-tp"),
    ("pipeline.py", "pp-dp", 4, "pp-dp"),
    ("deepspeed.py", "pp-dp", 2, "ds-pp"),  # DeepSpeed's PipelineModule with (hidden, padding mask) activations
])
def test_bert_layouts_match_one_process(tmp_path, bert_reference, launcher, recipe, nproc, strategy):
    run(torchrun(launcher, nproc, tmp_path / "out", "--recipe", recipe, *BERT, f"parallelism.strategy={strategy}"),
        tmp_path)
    check_same_model(bert_reference, tmp_path / "out", nproc, strategy)


@pytest.mark.parametrize("launcher", ["fsdp.py", "deepspeed.py", "tensor_parallel.py", "pipeline.py"])
def test_ccl_without_binding_is_refused(tmp_path, launcher):
    result = subprocess.run([sys.executable, str(REPO / "launchers" / launcher), "--backend", "ccl", *CNN],
                            capture_output=True, text=True, env=env(tmp_path), cwd=tmp_path, timeout=300)
    assert result.returncode != 0
    assert "backend ccl needs Intel's oneCCL binding: install oneccl_bindings_for_pytorch" in result.stderr
    assert "Traceback" not in result.stderr


@ranks
def test_layout_that_does_not_fit_the_world_is_refused(tmp_path):
    with pytest.raises(AssertionError, match="dp-tp with tensor_parallel_size 2 needs a world size divisible by 4"):
        run(torchrun("tensor_parallel.py", 2, tmp_path / "out", "--recipe", "dp-tp", *BERT), tmp_path)


def test_horovod_launcher_outside_horovodrun_says_how(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "launchers" / "horovod.py"), *CNN], capture_output=True,
                            text=True, env={k: v for k, v in env(tmp_path).items() if not k.startswith("HOROVOD_")},
                            cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and "runs under horovodrun" in result.stderr


# -- two hosts: network namespaces joined by a veth pair ------------------------------------------------------

def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    """Two network namespaces with only `lo` and one end of a veth pair each: 10.77.0.1 and 10.77.0.2."""
    tag = f"{os.getpid() % 100000}"
    hosts = [(f"zoo-a{tag}", f"zva{tag}", "10.77.0.1"), (f"zoo-b{tag}", f"zvb{tag}", "10.77.0.2")]
    try:
        for ns, _, _ in hosts:
            _ip("netns", "add", ns)
        _ip("link", "add", hosts[0][1], "netns", hosts[0][0], "type", "veth", "peer", "name", hosts[1][1],
            "netns", hosts[1][0])
        for ns, dev, addr in hosts:
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield hosts
    finally:
        for ns, _, _ in hosts:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # deletes the veth pair with it


@ranks
@pytest.mark.parametrize("launcher,strategy", [("fsdp.py", "fsdp")])
def test_torchrun_across_two_hosts(tmp_path, cnn_reference, two_hosts, launcher, strategy):
    port = free_port()
    endpoint = f"{two_hosts[0][2]}:{port}"
    procs = []
    for node, (ns, dev, addr) in enumerate(two_hosts):
        # The endpoint's host serves the rendezvous store; its address is not this machine's hostname, so say so.
        host_conf = ["--rdzv-conf=is_host=1"] if node == 0 else []
        # Both "hosts" see the same output folder, as nodes of a cluster share a filesystem for checkpoints.
        cmd = ["ip", "netns", "exec", ns, str(BIN / "torchrun"), "--nnodes=2", "--nproc_per_node=1",
               "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=zoo-test", *host_conf,
               f"--local-addr={addr}", str(REPO / "launchers" / launcher), "--output-dir", str(tmp_path / "out"),
               *CNN, f"parallelism.strategy={strategy}"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                      env=env(tmp_path, GLOO_SOCKET_IFNAME=dev)))
    try:
        outputs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()  # a node left waiting for a peer that failed
    for p, (stdout, stderr) in zip(procs, outputs):
        assert p.returncode == 0, failed_run(p.args, stdout, stderr)
    check_same_model(cnn_reference, tmp_path / "out", 2, strategy)


# -- checkpoints: each strategy's own format resumes to the same weights ------------------------------------

RESUMABLE = [*CNN, "checkpoint.interval_steps=5"]


@ranks
@pytest.mark.parametrize("launcher,strategy", [("deepspeed.py", "zero3"), ("pipeline.py", "pp")])
def test_killed_rank_resumes_to_same_weights(tmp_path, launcher, strategy):
    cmd = torchrun(launcher, 2, tmp_path / "crashed", *RESUMABLE, f"parallelism.strategy={strategy}")
    _, crashed = run_together(
        tmp_path, (torchrun(launcher, 2, tmp_path / "clean", *RESUMABLE, f"parallelism.strategy={strategy}"), {}),
        ([*cmd[:3], "--max-restarts=1", *cmd[3:]], {"ZOO_TEST_FAULT": "train-step@1:12"}))
    assert "resumed from the checkpoint at step 10" in crashed.stdout + crashed.stderr
    assert worst_difference(tmp_path / "clean", tmp_path / "crashed") == 0.0


@ranks
def test_horovod_resumes_after_a_killed_rank(tmp_path):
    def horovod(out: str, *extra: str) -> list[str]:
        return [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                str(REPO / "launchers" / "horovod.py"), "--output-dir", str(tmp_path / out), *RESUMABLE, *extra]

    clean, failed = side_by_side((horovod("clean"), env(tmp_path), tmp_path),
                                 (horovod("crashed"), env(tmp_path, ZOO_TEST_FAULT="train-step@1:12"), tmp_path))
    succeeded(clean)
    assert failed.returncode != 0  # horovodrun stops the job when a rank dies
    resumed = run(horovod("crashed", "--resume"), tmp_path)
    assert "resumed from the checkpoint at step 10" in resumed.stdout + resumed.stderr
    assert worst_difference(tmp_path / "clean", tmp_path / "crashed") == 0.0


def int8_tensors(path: Path) -> dict:
    import onnx
    from onnx import numpy_helper

    return {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}


@ranks
def test_qat_int8_from_n_processes_is_the_1_process_model(tmp_path, qat_reference):
    """Observers follow the global batch (zoo.train.qat.ObservedRanges): same quantization parameters and the same
    test-set predictions from 1 process, 2 DDP processes (also with micro-batches) and Horovod."""
    import numpy as np

    from zoo.data import load_dataset
    from zoo.ort import ort

    outs = {"1 process": qat_reference}  # made in the single-process part (test_the_one_process_references_...)
    # FSDP, ZeRO, tensor and pipeline fp32 phases hand QAT to the same DDP path (zoo.train.parallel.qat_strategy).
    # One job, two cells: a replica's whole share of the global batch of 64 at once, and in micro-batches of 16.
    outs["ddp"], outs["ddp micro-batches"] = tmp_path / "ddp" / "32", tmp_path / "ddp" / "16"
    outs["horovod"] = tmp_path / "horovod"
    run_together(tmp_path,
                 (torchrun("ddp.py", 2, tmp_path / "ddp", *QAT, "--sweep", "parallelism.micro_batch_size=32,16"), {}),
                 ([str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                   str(REPO / "launchers" / "horovod.py"), "--output-dir", str(outs["horovod"]), *QAT], {}))

    test = load_dataset("digits").test
    predictions = {}
    for name, out in outs.items():
        session = ort.InferenceSession(str(out / "model.int8-qat.onnx"), providers=["CPUExecutionProvider"])
        predictions[name] = session.run(None, {session.get_inputs()[0].name: test.x.numpy()})[0].argmax(-1)
        assert summary(out)["phases"]["qat"]["ranks_consistent"] is True, name
    reference = int8_tensors(outs["1 process"] / "model.int8-qat.onnx")
    for name, out in outs.items():
        got = int8_tensors(out / "model.int8-qat.onnx")
        assert set(got) == set(reference), name
        for key, want in reference.items():
            if want.dtype.kind == "f":  # scales, float biases
                assert np.abs(got[key] - want).max() <= 1e-5 * (np.abs(want).max() + 1e-12), (name, key)
            elif want.dtype == np.int32:  # biases quantized with scale_in * scale_w: equal scales, equal up to rounding
                assert np.abs(got[key].astype(np.int64) - want).max() <= 2, (name, key)
            else:  # int8 weights and zero points: a weight on a rounding boundary may land one step away
                assert np.abs(got[key].astype(np.int64) - want).max() <= 1, (name, key)
        assert (predictions[name] == predictions["1 process"]).all(), name


@ranks
@pytest.mark.parametrize("launcher,strategy,bytes_per_param", [
    ("ddp.py", "ddp", 16.0),  # 4 weights + 4 gradients + 8 Adam moments
    ("fsdp.py", "fsdp", 16.0 / 2),  # everything sharded over 2 ranks
    ("deepspeed.py", "zero3", 16.0 / 2),  # no fp32 master copy besides the model's partition (share_fp32_master)
])
def test_memory_by_category_matches_the_zero_accounting(tmp_path, launcher, strategy, bytes_per_param):
    from zoo.train.memory import allocator_env

    out = tmp_path / "out"
    jemalloc = allocator_env({})  # what `zoo train` gives its workers; make setup installs jemalloc
    assert jemalloc.get("LD_PRELOAD", "").startswith("libjemalloc"), "jemalloc missing: run make setup"
    run(torchrun(launcher, 2, out, "--recipe", "fp32", *BERT, "optimizer.name=adamw", "export.variants=[]",
                 f"parallelism.strategy={strategy}", "--profile-memory"), tmp_path, **jemalloc)
    got = summary(out)
    assert got["allocator"] == "jemalloc"
    memory = got["phases"]["fp32"]["memory_mib"]
    expected = bytes_per_param * got["num_params"] / 2**20
    for rank in range(2):
        assert memory["model_states"][rank] == pytest.approx(expected, rel=0.05), memory
        assert memory["activations"][rank] > 0
    if strategy == "zero3":
        config = json.loads((out / "deepspeed_config.json").read_text())["zero_optimization"]
        # buffers derived from the model's size (deepspeed.buffer_sizes), not DeepSpeed's 5e8-element defaults
        assert config["reduce_bucket_size"] == max(2**16, got["num_params"] // 16)
        assert config["stage3_max_live_parameters"] == 2 * config["reduce_bucket_size"]


@pytest.mark.parametrize("sweep,message", [
    (["precision"], "--sweep 'precision': expected KEY=V1,V2"),
    (["precision=../escape"], "--sweep 'precision=../escape': expected KEY=V1,V2"),  # cell folders stay inside
    (["parallelism.strategy=ddp,zero3"], "launchers/ddp.py does not run zero3 (it runs ddp)"),
    (["precision=fp32", "precision=bf16"], "--sweep names one key twice"),
    (["precision=fp32,fp64"], "precision"),  # every cell's recipe is checked before any process group exists
])
def test_a_bad_sweep_is_one_line_before_any_training(tmp_path, sweep, message):
    args = [a for item in sweep for a in ("--sweep", item)]
    result = subprocess.run([sys.executable, str(REPO / "launchers" / "ddp.py"), *CNN, "--output-dir",
                             str(tmp_path / "out"), *args], capture_output=True, text=True, env=env(tmp_path),
                            cwd=tmp_path, timeout=300)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not (tmp_path / "out").exists()
