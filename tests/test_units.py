"""Direct tests of pure functions that the end-to-end runs reach only through training and export: the batch plan and
learning-rate schedule, graph rewrites (topological order, Gemm as MatMul, int8 embedding tables) and the hashing
writer behind every download; and the suite's own limit on a child's wall-clock time."""

from __future__ import annotations

import hashlib
import io
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from zoo.data.base import cut_padding, sequence_lengths
from zoo.errors import ZooError
from zoo.models import build_model
from zoo.onnx_passes import gemm_as_matmul, quantize_embeddings, topological_sort
from zoo.ort import ort
from zoo.store.verified_writes import HashingWriter
from zoo.train.launch import root_failure
from zoo.train.schedule import LENGTH_GROUP_BATCHES, BatchPlan, Phase, lr_at
from zoo.variants.checks import Row, summary_line

from tests.helpers import REPO, fresh_python


def _run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_lr_at_warms_up_linearly_then_follows_the_schedule():
    phase = Phase("fp32", steps=110, lr=0.1, warmup_steps=10)
    assert [lr_at(s, phase, "cosine") for s in (0, 4, 9)] == pytest.approx([0.01, 0.05, 0.1])
    assert lr_at(10, phase, "cosine") == pytest.approx(0.1)
    assert lr_at(60, phase, "cosine") == pytest.approx(0.05)  # half way: cos(pi/2)
    assert lr_at(110, phase, "cosine") == pytest.approx(0.0, abs=1e-12)
    assert lr_at(75, phase, "constant") == 0.1
    steps = [lr_at(s, phase, "cosine") for s in range(10, 111)]
    assert all(a >= b for a, b in zip(steps, steps[1:]))  # never rises after the warm-up
    assert lr_at(3, Phase("qat", steps=5, lr=1.0, warmup_steps=0), "cosine") == pytest.approx(
        0.5 * (1 + math.cos(math.pi * 3 / 5)))


def test_batch_plan_splits_each_global_batch_among_the_replicas():
    plans = [BatchPlan(100, 16, rank, 4, seed=3, micro_batch=2) for rank in range(4)]
    assert plans[0].steps_per_epoch == 6 and plans[0].accumulation == 2
    for step in (0, 5, 6, 13):
        shares = [p.rank_indices(step, salt=0) for p in plans]
        together = torch.cat(shares)
        assert len(together) == 16 and len(set(together.tolist())) == 16  # disjoint, whole global batch
        assert torch.equal(shares[1], BatchPlan(100, 16, 1, 4, seed=3, micro_batch=2).rank_indices(step, 0))
        assert [len(m) for m in plans[2].micro_batches(step, 0)] == [2, 2]
    epoch = torch.cat([torch.cat([p.rank_indices(s, 0) for p in plans]) for s in range(6)])
    assert len(set(epoch.tolist())) == 96  # one epoch: every kept example once (the last partial batch dropped)
    assert not torch.equal(plans[0].rank_indices(0, 0), plans[0].rank_indices(6, 0))  # a new order each epoch
    assert not torch.equal(plans[0].rank_indices(0, 0), plans[0].rank_indices(0, 1))  # the salt changes it
    with pytest.raises(ZooError, match="not divisible"):
        BatchPlan(100, 10, 0, 4, seed=0, micro_batch=None)
    with pytest.raises(ZooError, match="exceeds"):
        BatchPlan(10, 16, 0, 2, seed=0, micro_batch=None)
    with pytest.raises(ZooError, match="does not divide"):
        BatchPlan(100, 16, 0, 2, seed=0, micro_batch=3)


def test_group_by_length_keeps_each_example_once_in_batches_of_similar_length():
    """group_by_length: one epoch still takes every kept example once, each global batch's texts have nearly one
    length (so a cut batch computes little padding), the batches come in shuffled order, and every rank draws the same
    global batch; without lengths the plan is the one every earlier build trained with."""
    n, batch = 2000, 16
    lengths = torch.randint(2, 65, (n,), generator=torch.Generator().manual_seed(0))
    plans = [BatchPlan(n, batch, rank, 2, seed=1, micro_batch=4, lengths=lengths) for rank in range(2)]
    plain = BatchPlan(n, batch, 0, 2, seed=1, micro_batch=4)
    steps = plans[0].steps_per_epoch
    grouped = [torch.cat([p.rank_indices(s, 0) for p in plans]) for s in range(steps)]
    assert sorted(torch.cat(grouped).tolist()) == sorted(plain.epoch_order(0, 0)[:steps * batch].tolist())
    widths = [int(lengths[b].max()) for b in grouped]
    spread = [int(lengths[b].max() - lengths[b].min()) for b in grouped]
    plain_widths = [int(lengths[b].max()) for b in plain.epoch_order(0, 0)[:steps * batch].view(steps, batch)]
    assert max(spread) <= 8 and sum(widths) < 0.7 * sum(plain_widths)  # uniform lengths: ~half the columns
    assert widths != sorted(widths) and widths != sorted(widths, reverse=True)  # long and short batches interleave
    assert steps * batch > batch * LENGTH_GROUP_BATCHES  # more than one run of batches was sorted
    fresh = BatchPlan(n, batch, 1, 2, seed=1, micro_batch=4, lengths=lengths)
    assert all(torch.equal(fresh.rank_indices(s, 0), plans[1].rank_indices(s, 0)) for s in (0, 7, steps - 1))
    assert not torch.equal(plans[0].rank_indices(0, 0), plans[0].rank_indices(steps, 0))  # a new order each epoch
    order = torch.randperm(n, generator=torch.Generator().manual_seed(1 * 1_000_003 + 0 * 10_007 + 1))
    assert torch.equal(plain.rank_indices(steps + 3, 0), order[3 * batch:3 * batch + batch // 2])


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_cut_padding_drops_only_trailing_padding_and_bert_reads_the_same(pooling):
    """A batch cut to its longest text gives a BERT classifier the same outputs: padding is masked and positions
    count from the start, so group_by_length changes what is computed, not what is learned."""
    x = torch.tensor([[2, 5, 3, 0, 0, 0], [2, 7, 0, 9, 3, 0], [2, 3, 0, 0, 0, 0]])
    assert sequence_lengths(x, 0).tolist() == [3, 5, 2]  # the last real token counts, not the number of them
    assert torch.equal(cut_padding(x, 0), x[:, :5])
    assert cut_padding(torch.zeros(2, 4, dtype=torch.long), 0).shape == (2, 1)
    torch.manual_seed(0)
    model = build_model("bert-tiny", num_classes=8, vocab_size=64, pooling=pooling).eval()
    ids = torch.randint(1, 64, (4, 24))
    for row, length in enumerate((24, 9, 5, 13)):
        ids[row, length:] = 0
    with torch.no_grad():
        torch.testing.assert_close(model(cut_padding(ids, 0)), model(ids), rtol=1e-5, atol=1e-5)
    assert cut_padding(ids, 0).shape == (4, 24) and cut_padding(ids[1:], 0).shape == (3, 13)


def _chain() -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_eval_examples_spread_over_the_split_and_keep_every_label():
    from zoo.data.base import Dataset, Split

    y = torch.arange(8).repeat_interleave(300)  # stored in label order, as the language-ID splits are
    x = torch.arange(2400).unsqueeze(1)
    data = Dataset("d", Split(x[:10], y[:10]), Split(x[:10], y[:10]), Split(x, y), [str(i) for i in range(8)], "", "")
    assert data.split("test") is data.test and data.split("test", 5000) is data.test  # all of it
    part = data.split("test", 256)
    assert len(part) == 256 and torch.equal(part.x[:, 0], part.x[:, 0].sort().values)  # positions in split order
    assert torch.equal(part.y, y[part.x[:, 0]]) and part.x[0, 0] == 0 and part.x[-1, 0] == 2399
    assert torch.bincount(part.y).tolist() == [32] * 8  # every label, as often as in the split
    assert torch.equal(data.split("test", 256).x, part.x)  # the same examples every time


def test_topological_sort_orders_producers_first_and_refuses_cycles():
    model = _chain()
    shuffled = list(reversed(model.graph.node))
    del model.graph.node[:]
    model.graph.node.extend(shuffled)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
    topological_sort(model.graph)
    onnx.checker.check_model(model)
    assert [n.op_type for n in model.graph.node] == ["Relu", "Neg", "Add"]
    cyclic = _chain()
    cyclic.graph.node[0].input[0] = "y"
    with pytest.raises(ValueError, match="cycle"):
        topological_sort(cyclic.graph)


def _gemm(alpha: float = 1.0) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((3, 5)).astype(np.float32), "W")  # [out, in]: transB
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "B")
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "W", "B"], ["y"], transB=1, alpha=alpha)], "linear",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])], initializer=[w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_gemm_as_matmul_keeps_the_arithmetic():
    x = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    original = _gemm()
    rewritten = gemm_as_matmul(_gemm())
    onnx.checker.check_model(rewritten)
    assert [n.op_type for n in rewritten.graph.node] == ["MatMul", "Add"]
    assert {i.name for i in rewritten.graph.initializer} == {"W.matmul", "B"}  # the transposed copy replaces W
    np.testing.assert_allclose(_run(rewritten, {"x": x}), _run(original, {"x": x}), rtol=1e-6, atol=1e-6)
    scaled = gemm_as_matmul(_gemm(alpha=2.0))  # not a plain Linear: left as it is
    assert [n.op_type for n in scaled.graph.node] == ["Gemm"]


def test_predict_batches_rows_unless_the_graph_quantizes_activations_per_batch(tmp_path):
    """zoo.evaluate.predict runs BATCH rows at a time where each row's logits do not depend on the others (the same
    bytes at any batch), and a dynamically quantized file at DYNAMIC_BATCH, the batch its card was measured at: one
    activation scale over the whole batch makes its outputs depend on the rows beside them."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from zoo.evaluate import BATCH, DYNAMIC_BATCH, batch_size_for, predict

    rng = np.random.default_rng(3)
    weights = rng.standard_normal((8, 4)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["logits"])], "linear",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])],
                              initializer=[numpy_helper.from_array(weights, "W")])
    fp32, dynamic = tmp_path / "model.onnx", tmp_path / "model.int8-dynamic.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), fp32)
    quantize_dynamic(fp32, dynamic, weight_type=QuantType.QInt8)
    # small rows, then rows a hundred times larger: a batch holding both quantizes the small ones coarsely
    x = np.concatenate([rng.standard_normal((40, 8)), 100 * rng.standard_normal((40, 8))]).astype(np.float32)
    assert (batch_size_for(fp32), batch_size_for(dynamic)) == (BATCH, DYNAMIC_BATCH) and BATCH < len(x) < DYNAMIC_BATCH
    one_by_one = predict(fp32, x, batch_size=1)
    assert np.array_equal(predict(fp32, x), one_by_one) and np.array_equal(predict(fp32, x, batch_size=len(x)), one_by_one)
    measured = predict(dynamic, x, batch_size=DYNAMIC_BATCH)
    assert np.array_equal(predict(dynamic, x), measured)
    assert not np.array_equal(predict(dynamic, x, batch_size=BATCH), measured)  # why it keeps its card's batch


def test_quantize_embeddings_stores_int8_rows_within_half_a_step():
    rng = np.random.default_rng(2)
    table = (rng.standard_normal((100, 16)) * rng.uniform(0.1, 3.0, (100, 1))).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Gather", ["E", "ids"], ["y"])], "embed",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16])],
                              initializer=[numpy_helper.from_array(table, "E")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    ids = np.arange(100, dtype=np.int64)
    quantized = quantize_embeddings(onnx.load_model_from_string(model.SerializeToString()))
    onnx.checker.check_model(quantized)
    tables = [i.data_type for i in quantized.graph.initializer if list(i.dims) == [100, 16]]
    assert tables == [TensorProto.INT8]  # the fp32 table is gone
    step = np.abs(table).max(axis=1, keepdims=True) / 127  # symmetric, one scale per row
    error = np.abs(_run(quantized, {"ids": ids}) - table)
    assert (error <= step / 2 + 1e-6).all()
    assert len(quantized.SerializeToString()) < 0.4 * len(model.SerializeToString())
    small = helper.make_model(helper.make_graph(
        [helper.make_node("Gather", ["E", "ids"], ["y"])], "small",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16])],
        initializer=[numpy_helper.from_array(table[:8], "E")]), opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    assert quantize_embeddings(small) == small  # tables under min_rows stay fp32


def test_hashing_writer_writes_and_hashes_the_same_bytes():
    data = [bytes([i]) * (1 << 16) for i in range(40)]
    out = io.BytesIO()
    with HashingWriter(out, depth=2) as sink:
        for chunk in data:
            sink.write(chunk)
        digest = sink.close()
    assert out.getvalue() == b"".join(data) and digest.hexdigest() == hashlib.sha256(b"".join(data)).hexdigest()
    resumed = hashlib.sha256(data[0])  # a resumed download: the digest carries the bytes already on disk
    with HashingWriter(io.BytesIO(), resumed) as sink:
        for chunk in data[1:]:
            sink.write(chunk)
        assert sink.close().hexdigest() == digest.hexdigest()


def test_every_command_and_launcher_answers_help():
    """`--help` prints usage and exits 0 everywhere: each `zoo` command (and subcommand), each launcher script (the
    Horovod one too, outside horovodrun) and each of federated.py's subcommands."""
    import os
    import subprocess
    import sys

    import typer
    from typer.testing import CliRunner

    from tests.helpers import REPO
    from zoo.cli import app

    group = typer.main.get_command(app)
    runner = CliRunner()
    paths = [[]] + [[name] for name in group.commands]
    for name, command in group.commands.items():
        paths += [[name, sub] for sub in getattr(command, "commands", {})]
    for path in paths:
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output, (path, result.output)
    scripts = [[str(p), "--help"] for p in sorted((REPO / "launchers").glob("*.py"))]
    scripts += [[str(REPO / "launchers" / "federated.py"), sub, "--help"] for sub in ("run", "simulate")]
    running = [(s, subprocess.Popen([sys.executable, *s], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env={k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}))
               for s in scripts]
    for script, process in running:
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0 and "usage" in stdout.lower(), (script, stdout, stderr)


def test_the_cli_reads_at_80_columns():
    """Every command's output at 80 columns: no line wider unless it is one unbreakable token or command, no token
    split across lines or cut with an ellipsis (every word is one the 400-column output has), no `command` broken."""
    import os
    import re
    import subprocess
    import sys

    from tests.helpers import REPO

    commands = [["list"], ["card", "digits-cnn"], ["card", "bert-tiny"], ["card", "bert-base"], ["info", "digits-cnn"],
                ["info", "bert-mini"], ["fetch", "digits-cnn", "--variant", "int8-qat"], ["--help"], ["fetch", "--help"],
                ["register", "--help"]]

    def render(args: list[str], columns: int) -> str:
        result = subprocess.run([sys.executable, "-m", "zoo.cli", *args], capture_output=True, text=True, cwd=REPO,
                                env={**os.environ, "COLUMNS": str(columns), "TERM": "dumb", "NO_COLOR": "1"}, timeout=300)
        assert result.returncode == 0, (args, result.stderr)
        return result.stdout + result.stderr

    for args in commands:
        narrow, wide = render(args, 80), render(args, 400)
        known = set(wide.split())
        for line in narrow.splitlines():
            if len(line) > 80:  # only a token or a `command` longer than the line may stand alone on it
                assert " " not in re.sub(r"`[^`]*`", "", line.strip()), (args, line)
        split = [token for token in narrow.split() if token not in known]
        assert not split, (args, split[:5], narrow)
        broken = [line for line in narrow.splitlines() if line.count("`") % 2]
        assert not broken, (args, "a `command` broken across lines", broken)


def test_variants_slower_than_fp32_are_explained_once_per_reason():
    """`zoo card` and the model pages share one sentence per reason (zoo.kinds.slower_than_fp32): every variant
    slower than fp32 at batch 1 or 32 is named once, no reason twice, and none names layers the family lacks."""
    from zoo import catalog
    from zoo.kinds import slower_than_fp32

    for name in catalog.list_models():
        card = catalog.get_card(name)
        said = slower_than_fp32(card)
        slow = {k for k, v in card.variants.items()
                if k != "fp32" and v.speed and min(v.speed.batch_1.vs_fp32, v.speed.batch_32.vs_fp32) < 1}
        named = [k for who, _ in said for k in card.variants
                 if k != "fp32" and re.search(rf"(^| ){re.escape(k)}( |$)", who.split(" slower than")[0])]
        assert sorted(named) == sorted(slow), (name, said)
        assert len({why for _, why in said}) == len(said)
        assert not any(word in why for _, why in said for word in ("GRU", "attention")), said


def test_a_validation_summary_counts_planned_entries_apart_from_checks():
    """A planned entry (nothing built) is neither a pass nor a skip: the one summary wording says so apart."""
    rows = [Row("a", "fp32", "accuracy", True), Row("a", "int8-qat", "accuracy", False),
            Row("b", "*", "obtain", True, skipped=True), Row("c", "*", "built", True, planned=True)]
    assert [r.verdict for r in rows] == ["pass", "FAIL", "skip", "planned"]
    assert summary_line(rows, 2.4) == ("1 check passed, 1 failed, 1 skipped (1 planned entry not built: nothing to "
                                       "measure), in 2 s.")
    assert summary_line(rows[:1], 1.0) == "1 check passed, 0 failed, 0 skipped, in 1 s."


def test_a_rebuild_budget_is_spent_once():
    """The run's rebuild budget (shared by the processes of `zoo validate --jobs`): a rebuild takes its seconds out
    before it starts, one that does not fit is refused and spends nothing; None has no limit."""
    from zoo.validate import RebuildBudget

    budget = RebuildBudget(100.0)
    assert budget.take(60.0) and not budget.take(60.0) and budget.left == 40.0 and budget.take(40.0)
    assert budget.left == 0.0 and budget.take(0.0) and not budget.take(0.5)
    unlimited = RebuildBudget(None)
    assert unlimited.take(1e9) and unlimited.left == float("inf")


def test_a_cards_command_says_how_many_processes_its_rebuild_runs(tmp_path):
    """The process count `zoo fetch --build` and `zoo reproduce` run a card's build with: torchrun's (1 when it names
    none, as torchrun does), `zoo import`'s recorded --nproc (2 on cards written before it was recorded), the command
    `zoo fetch --build` runs for an imported entry carries it, and so does the docs page's import command."""
    from zoo import catalog
    from zoo.docs.model_page import model_page
    from zoo.recipes import command_processes, import_command
    from zoo.store.build_on_miss import training_command

    assert command_processes("torchrun --standalone --nproc_per_node=8 launchers/ddp.py --recipe bert-base") == 8
    assert command_processes("torchrun --nproc_per_node 4 launchers/fsdp.py") == 4
    assert command_processes("torchrun launchers/ddp.py --recipe fp32") == 1
    assert command_processes("zoo import x --from <checkpoint dir> --nproc 3") == 3
    assert command_processes("zoo import x --from <checkpoint dir> --nproc=1") == 1
    assert command_processes("zoo import minilm-l6 --from <checkpoint dir>") == 2
    assert command_processes(None) == 1
    card = catalog.get_card("minilm-l6")
    shown = card.training.command
    for recorded, processes in [(shown, 2), (f"{shown} --nproc 1", 1)]:
        command = training_command(card.model_copy(update={"training": card.training.model_copy(
            update={"command": recorded})}))
        assert command[:3] == ["torchrun", "--standalone", f"--nproc_per_node={processes}"], command
    assert command_processes(import_command("x", 3)) == 3 and command_processes(import_command("x")) == 2
    assert f"\n{import_command('minilm-l6', 2)}   # " in model_page(catalog.entries()["minilm-l6"], {}, tmp_path)


def test_side_by_side_validation_starts_the_most_inference_first():
    """`zoo validate --jobs 2` starts the entries by measuring_work (parameters x test examples x built variants): the
    largest BERT first, so it does not run alone at the end; a planned entry (nothing built) has none."""
    from zoo import catalog
    from zoo.validate import measuring_work

    order = sorted(["digits-cnn", "bert-base", "bert-tiny", "minilm-l6", "bert-mini"], key=measuring_work, reverse=True)
    assert order == ["minilm-l6", "bert-mini", "bert-tiny", "digits-cnn", "bert-base"]
    card = catalog.get_card("bert-tiny")
    assert measuring_work("bert-tiny") == card.num_params * card.dataset.splits["test"] * len(card.variants)
    assert measuring_work("bert-base") == 0


def test_int8_peak_follows_the_best_int8_instructions_the_cpu_has():
    """The int8:fp32 multiply-accumulate ratio of the kernels onnxruntime runs, by the best instructions present."""
    from zoo.provenance import int8_peak

    avx2 = ["sse4_2", "avx", "avx2", "fma"]
    assert int8_peak(avx2)[0] == 2.0 and "VPMADDUBSW" in int8_peak(avx2)[1]
    assert int8_peak([*avx2, "avx512f", "avx512bw"])[0] == 2.0
    assert int8_peak([*avx2, "avx512f", "avx512bw", "avx512_vnni"])[0] == 4.0
    assert int8_peak([*avx2, "avx_vnni"])[0] == 4.0
    assert int8_peak([*avx2, "avx512bw", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16"])[0] == 32.0
    assert int8_peak([*avx2, "avx512bw", "avx512_vnni", "amx_tile", "amx_bf16"])[0] == 4.0  # AMX without its int8 unit
    assert int8_peak(["sse4_2"])[0] == 2.0


def test_int8_bound_is_amdahls_law_over_the_matrix_products():
    """Only the matrix products speed up: 80% of the time in them at a 4x peak gives 1 / (0.2 + 0.2) = 2.5x."""
    from zoo.evaluate import int8_bound

    profile = {"MatMul": 50.0, "Attention": 30.0, "BiasGelu": 15.0, "SkipLayerNormalization": 5.0}
    assert int8_bound(profile, 4.0) == pytest.approx(2.5)
    assert int8_bound(profile, 1.0) == pytest.approx(1.0) and int8_bound({"Add": 1.0}, 32.0) == pytest.approx(1.0)


def test_a_finished_rank_leaves_without_the_interpreters_finalization():
    """zoo.train.entry: after a finished run a launcher's process exits 0, its buffered output flushed, and skips the
    interpreter's finalization (where torch's C++ teardown once aborted a finished rank): no atexit handler runs and
    nothing after the run. The trainer is replaced by a stand-in (no torch)."""
    script = """
import atexit, sys, types
fake = types.ModuleType("zoo.train.launch")
def launch(launcher, args, init=None):
    atexit.register(lambda: print(" finalized", flush=True))
    print("trained", launcher, args.recipe, end="")  # buffered: leave() flushes it
fake.launch = launch
sys.modules["zoo.train.launch"] = fake
sys.argv = ["ddp.py", "--recipe", "fp32"]
from zoo.train.entry import run_launcher
run_launcher("ddp")
print(" after the run")
"""
    assert fresh_python(script).stdout == "trained ddp fp32"


def test_the_root_failure_is_the_rank_that_failed_not_the_one_torchrun_stopped():
    # Both collected within one second and without error files: torchrun's own get_first_failure names rank 0.
    failed = ProcessFailure(local_rank=1, pid=12, exitcode=1, error_file="")
    stopped = ProcessFailure(local_rank=0, pid=11, exitcode=-15, error_file="")
    stopped.timestamp = failed.timestamp
    exc = ChildFailedError("launchers/ddp.py", {0: stopped, 1: failed})
    assert exc.get_first_failure()[0] == 0
    assert root_failure(exc) == (1, failed)
    # Two ranks failing on their own: the earlier one, and by rank when the second is the same.
    later = ProcessFailure(local_rank=0, pid=11, exitcode=2, error_file="")
    later.timestamp = failed.timestamp + 1
    assert root_failure(ChildFailedError("x", {0: later, 1: failed}))[0] == 1
    later.timestamp = failed.timestamp
    assert root_failure(ChildFailedError("x", {0: later, 1: failed}))[0] == 0
    # Every rank stopped by a signal (an OOM kill, a node lost): still one of them, not an error.
    assert root_failure(ChildFailedError("x", {1: stopped}))[0] == 1


def _dropout_flags(graph: torch.fx.GraphModule) -> list[bool]:
    return [node.args[2] for node in graph.graph.nodes if str(node.target) == "aten.dropout.default"]


def test_a_qat_graph_switches_train_and_eval_only_where_an_op_depends_on_it(monkeypatch):
    """PT2E's train/eval switch traces its dropout and batch-norm patterns anew on every call (zoo.train.qat
    allow_train_eval): the CNN's QAT graph, which has neither, never calls it; a graph with dropout trains with it on
    and is converted with it off."""
    import torchao.quantization.pt2e.utils as pt2e_utils

    from zoo.train.qat import convert_qat, prepare_qat

    traced = []
    pattern = pt2e_utils._get_aten_graph_module_for_pattern
    monkeypatch.setattr(pt2e_utils, "_get_aten_graph_module_for_pattern",
                        lambda *args, **kwargs: traced.append(1) or pattern(*args, **kwargs))
    cnn = prepare_qat(build_model("digits-cnn", 10), torch.randn(2, 1, 8, 8))
    cnn.train()
    cnn.eval()
    convert_qat(cnn)
    assert traced == []
    with_dropout = prepare_qat(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5),
                                                   torch.nn.Linear(8, 3)), torch.randn(2, 8))
    assert _dropout_flags(with_dropout) == [True] and traced
    assert _dropout_flags(convert_qat(with_dropout)) == [False]


def test_a_launcher_rank_freezes_what_its_imports_made():
    """zoo.train.entry: a rank's imports (torch: ~200,000 objects) are out of the cyclic GC's reach before training, so
    no collection during the run walks them."""
    script = ("import gc, sys\nimport zoo.train.launch\n"
              "zoo.train.launch.launch = lambda *a, **k: print(gc.get_freeze_count())\n"
              "from zoo.train.entry import run_launcher\nsys.argv = ['ddp.py', '--recipe', 'fp32']\n"
              "run_launcher('ddp')\n")
    assert int(fresh_python(script).stdout.strip()) > 100_000


def test_a_deepspeed_rank_imports_deepspeed_without_mlflow():
    """zoo.train.parallel.deepspeed.import_deepspeed: DeepSpeed's autotuner imports MLflow if it can (most of
    `import deepspeed`); a DeepSpeed rank imports it with MLflow hidden, and rank 0's tracking still imports MLflow."""
    script = ("import sys\nfrom zoo.train.parallel.deepspeed import import_deepspeed\nimport_deepspeed()\n"
              "import deepspeed.autotuning.autotuner as tuner\n"
              "print('mlflow' in sys.modules, tuner.has_mlflow, 'mlflow' in sys.modules)\n"
              "import mlflow\nprint(mlflow.__name__)\n")
    assert fresh_python(script).stdout.split() == ["False", "False", "False", "mlflow"]


def test_a_child_at_idle_priority_outlives_its_wall_clock_limit():
    """make test's beside part and validation run at idle priority (ci/test.sh; niceness 19 is as low), where a child may
    wait minutes for a CPU with its work done: a wall-clock limit there killed a finished training run (CI at
    29b0fd1). tests.helpers.wall_limit lifts it at those background priorities only; pytest's own limit per test
    still catches hangs."""
    script = """
import os, subprocess, sys
from tests.helpers import wall_limit
os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # whatever priority the suite runs at
sleep = [sys.executable, "-c", "import time; time.sleep(1.5)"]
try:
    subprocess.run(sleep, timeout=wall_limit(0.5))
    raise AssertionError("at normal priority the limit holds")
except subprocess.TimeoutExpired:
    pass
os.setpriority(os.PRIO_PROCESS, 0, 18)
assert wall_limit(0.5) == 0.5
os.setpriority(os.PRIO_PROCESS, 0, 19)  # the lowest niceness
assert wall_limit(0.5) is None
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
assert wall_limit(0.5) is None
assert subprocess.run(sleep, timeout=wall_limit(0.5)).returncode == 0
"""
    fresh_python(script)


def test_a_rank_started_in_the_background_keeps_its_priority_in_a_session_of_its_own(tmp_path):
    """zoo.processes.keep_background_priority: torchrun starts each rank in a session of its own (horovodrun through
    `sh -c`), which Linux's autogroups schedule as a group of its own at niceness 0, whatever the rank's niceness. A
    rank at a background priority that owns its session gives the session's group its niceness; a rank at normal
    priority, or in its caller's session (here: the test's), leaves the group as it was."""
    if not Path("/proc/self/autogroup").exists():  # a kernel without autogroups: nothing to keep, nothing may fail
        from zoo.processes import keep_background_priority

        keep_background_priority()
        return
    rank = tmp_path / "rank.py"
    rank.write_text("import os, sys\nfrom zoo.processes import keep_background_priority\n"
                    "os.setpriority(os.PRIO_PROCESS, 0, int(sys.argv[1]))\n"
                    "if sys.argv[2:] == ['idle']:\n    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
                    "keep_background_priority()\nprint(open('/proc/self/autogroup').read().strip())\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def group(*args: str, new_session: bool = True, **extra: str) -> str:
        """The rank's /proc/self/autogroup: "/autogroup-ID nice N"; empty in the boot session's group (the root one:
        a test run whose processes never started a session of their own, as in a container's init)."""
        result = subprocess.run([sys.executable, str(rank), *args], capture_output=True, text=True, timeout=120,
                                env={**env, **extra}, start_new_session=new_session, check=True)
        return result.stdout.strip()

    def niceness(line: str) -> str:
        return line.split()[-1]  # a new session always has a group of its own, with a niceness

    def group_niceness(*args: str) -> str:
        return niceness(group(*args))

    own = Path("/proc/self/autogroup").read_text().strip()
    assert group_niceness("19") == "19"  # torchrun's rank under `nice -n 19`
    assert group_niceness("0", "idle") == "19"  # under `chrt --idle 0`: the lowest niceness
    assert group_niceness("7") == "7"
    assert group_niceness("0") == "0"  # in the foreground: as it was
    assert group("19", new_session=False) == own  # the test's session is not the rank's: its group as it was
    assert group("19", new_session=False, HOROVOD_RANK="0") == own
    assert Path("/proc/self/autogroup").read_text().strip() == own
    # horovodrun's rank: a session started above `sh -c`, which runs the rank as a child
    shell = f"{sys.executable} {rank} 19; true"  # `; true`: the shell stays, the rank its child
    result = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, timeout=120, check=True,
                            env={**env, "HOROVOD_RANK": "0"}, start_new_session=True)
    assert niceness(result.stdout) == "19"


def test_make_test_runs_every_part_of_the_suite():
    """ci/test.sh runs pytest once per part (tests/conftest.py PARTS, whose markers share every test among them): a part
    it left out would leave its tests unrun without a word, a part conftest does not know would fail at once."""
    from tests.conftest import PARTS

    runs = [line.split(" #")[0] for line in (REPO / "ci" / "test.sh").read_text().splitlines()
            if '"${PYTEST[@]}"' in line and not line.lstrip().startswith("#")]  # the lines that run pytest
    run = [part for line in runs for part in re.findall(r"--part (\w+)", line)]
    assert sorted(run) == sorted(PARTS), run
