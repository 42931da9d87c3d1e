#!/usr/bin/env bash
# CI's validation pipeline: re-measure every variant of every catalog entry against its card.
# Files come from the repository's store (store/), then the configured mirrors (zoo/config.py: ZOO_LFS_URL, lfs.url,
# the clone's remote): primaries and test data are fetched, the other kinds are made from fp32 and must match the
# card's sha256. An entry no store has (not yet published) is rebuilt from its recipe in a scratch folder when the
# rebuild fits the budget, else reported as a skip.
# Writes build/validation/validation.{md,json} (ignored: running the tests never modifies tracked files);
# `make validation-report` writes the committed benchmarks/results/ copy instead. Non-zero exit on any failed check.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# Fast part (every `make test`): entries rebuilt only when their rebuild fits the budget; `make validate-full`
# (ZOO_REBUILD_BUDGET=none) rebuilds everything. With a published store nothing is rebuilt at all.
budget=${ZOO_REBUILD_BUDGET:-300}
# Entries whose recipe builds in a few minutes are also rebuilt from scratch when a store had them (reproducibility).
# Two entries at a time, a process each (every onnxruntime session runs one thread): both CPUs busy (ZOO_VALIDATE_JOBS).
report=${ZOO_VALIDATION_REPORT:-build/validation/validation.md}
mkdir -p "$(dirname "$report")"
args=(--all --report "$report" --reproduce-budget "${ZOO_REPRODUCE_BUDGET:-120}" --jobs "${ZOO_VALIDATE_JOBS:-2}")
[ "$budget" = none ] || args+=(--rebuild-budget "$budget")
.venv/bin/zoo validate "${args[@]}"
echo "validation wall time: $(( $(date +%s) - start )) s"
