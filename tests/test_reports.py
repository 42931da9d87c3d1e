"""The committed benchmark reports describe the files a user downloads: each measured file is named by the sha256 of
the current card, with the machine, libraries and date it was measured on, and no published entry is missing."""

from __future__ import annotations

import copy
import importlib.util
import json

import pytest

from tests.helpers import REPO
from tests.test_repo_store import AWAITING_PUBLICATION
from zoo import catalog
from zoo.models import model_spec
from zoo.kinds import kind_of

RESULTS = REPO / "benchmarks" / "results"
CARDS = catalog.entries(REPO / "zoo" / "entries")


def measurable() -> set[str]:
    """Entries whose ONNX files anyone can fetch from the repository's store (and so measure)."""
    return {name for name, e in CARDS.items() if name not in AWAITING_PUBLICATION
            and any(v.built and kind_of(k, v).inference for k, v in e.card.variants.items())}


def current(name: str, variant: str, sha256: str, report: str) -> None:
    card = CARDS[name].card
    assert variant in card.variants, f"{report}: {name} {variant} is not on the card"
    assert sha256 == card.variants[variant].sha256, (
        f"{report}: {name} {variant} was measured on {sha256[:12]}, the card's file is "
        f"{card.variants[variant].sha256[:12]}: re-run the benchmark")


@pytest.mark.parametrize("report", ["latency.json", "profiles.json"])
def test_latency_reports_name_the_current_files(report):
    """One run per CPU kind, each naming its machine, libraries and date, only the current cards' files, and every
    entry anyone can fetch."""
    runs = json.loads((RESULTS / report).read_text())["runs"]
    machines = [(run["cpu"]["model"], tuple(run["cpu"]["flags"])) for run in runs]
    assert runs and len(set(machines)) == len(machines), f"{report}: one run per CPU kind, got {machines}"
    for data in runs:
        assert data["cpu"]["model"] and data["cpu"]["flags"] and data["libraries"]["onnxruntime"] and data["date"]
        for name, entry in data["entries"].items():
            files = entry["sha256"] if report == "latency.json" else {k: v["sha256"] for k, v in entry.items()}
            for variant, sha in files.items():
                if sha:  # fp32-fused is made from fp32 at measurement time
                    current(name, variant, sha, report)
        wanted = measurable() if report == "latency.json" else {n for n in measurable()
                                                                if model_spec(CARDS[n].card.architecture).transformer}
        assert wanted <= set(data["entries"]), f"{report} lacks {sorted(wanted - set(data['entries']))}: re-run it"


def test_baselines_report_names_the_current_files():
    data = json.loads((RESULTS / "baselines.json").read_text())
    measured = set()
    for run in data["runs"]:
        assert run["cpu"]["model"] and run["threads"]
        for task in run["tasks"].values():
            for row in task["rows"]:
                if row["kind"] == "entry":
                    current(row["tool"], row["variant"], row["sha256"], "baselines.json")
                    measured.add(row["tool"])
    missing = {n for n in measurable() if CARDS[n].card.task in {t for r in data["runs"] for t in r["tasks"]}} - measured
    assert not missing, f"baselines.json lacks {sorted(missing)}: python benchmarks/baselines.py {' '.join(sorted(missing))}"


def test_a_run_on_another_cpu_is_added_and_a_stale_one_dropped():
    """benchmarks/latency.py keeps one run per CPU kind: a run on this machine replaces its CPU's earlier run, leaves
    the other CPUs' runs while their files are the cards', and drops (and names) a run that measured an older file."""
    spec = importlib.util.spec_from_file_location("latency", REPO / "benchmarks" / "latency.py")
    latency = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(latency)
    committed_runs, committed_profiles = latency.committed(RESULTS)
    earlier = committed_runs[0]
    other = {**copy.deepcopy(earlier), "cpu": {**earlier["cpu"], "model": "A test CPU", "flags": ["sse4_2"]},
             "entries": {}}
    other_profiles = {**committed_profiles[0], "cpu": other["cpu"], "entries": {}}
    runs, profiles, dropped = latency.merged(committed_runs, committed_profiles, other, other_profiles)
    assert runs == sorted([*committed_runs, other], key=lambda r: (latency.cpu_kind(r["cpu"]), r["cpu"]["flags"]))
    assert not dropped
    assert len(profiles) == len(committed_profiles) + 1
    again, _, _ = latency.merged(runs, profiles, {**other, "date": "later"}, other_profiles)  # same CPU: replaced
    assert [r.get("date") for r in again if r["cpu"] == other["cpu"]] == ["later"] and len(again) == len(runs)
    stale = copy.deepcopy(earlier)
    name, entry = next(iter(stale["entries"].items()))
    entry["sha256"]["fp32"] = "0" * 64
    runs, _, dropped = latency.merged([stale], committed_profiles, other, other_profiles)
    assert runs == [other] and len(dropped) == 1 and f"{name} fp32 000000000000" in dropped[0], dropped


def test_the_routes_tried_for_int8_qat_are_reported_against_it():
    """benchmarks/latency.py times the routes tried to make int8-qat faster (zoo.bench.TRIED) in the same rounds and
    reports each as int8-qat's time over the route's, beside the share of int8-qat's time its float attention takes."""
    spec = importlib.util.spec_from_file_location("latency", REPO / "benchmarks" / "latency.py")
    latency = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(latency)
    runs, profile_runs = latency.committed(RESULTS)
    run, profiles = copy.deepcopy(runs[0]), copy.deepcopy(profile_runs[0])
    name = next(n for n, e in run["entries"].items() if "int8-qat" in e["threads"]["1"])
    run["entries"] = {name: run["entries"][name]}
    profiles["entries"] = {name: profiles["entries"][name]}
    for threads, per in run["entries"][name]["threads"].items():
        per.update({k: {b: {"median_ms": 2 * t["median_ms"], "p90_ms": 2 * t["p90_ms"]} for b, t in
                        per["int8-qat"].items()} for k in latency.TRIED})
    run["entries"][name]["accuracy"].update({k: 0.5 for k in latency.TRIED})
    text = latency.report(run, profiles)
    section = text.split("### What was tried for int8-qat")[1]
    qat = run["entries"][name]["threads"]["1"]["int8-qat"]["1"]["median_ms"]
    assert f"| {name} | 1 | 1 | {qat:.3f} | {2 * qat:.3f} (0.50x) | {2 * qat:.3f} (0.50x) |" in section
    assert "float matrix products" in section and f"{name} " in section.split("float matrix products")[1]
    assert "tried: int8-qat's file | 0.5000" in text  # the tried rows in the entry's tables, their accuracy measured
