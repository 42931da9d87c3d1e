#!/usr/bin/env bash
# CI's validation pipeline: re-measure every variant of every catalog entry against its card.
# Files come from the configured LFS stores (ZOO_LFS_URL; the Makefile points it at a published store laid
# beside the checkout when there is one), else each entry is rebuilt from its recipe in a scratch folder.
# Writes benchmarks/results/validation.{md,json} (the docs show it); exits non-zero on any failed check.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# Fast part (every `make test`): entries rebuilt only when their rebuild fits the budget; `make validate-full`
# (ZOO_REBUILD_BUDGET=none) rebuilds everything. With a published store nothing is rebuilt at all.
budget=${ZOO_REBUILD_BUDGET:-300}
# Entries whose recipe builds in a few minutes are also rebuilt from scratch when a store had them (reproducibility).
args=(--all --report benchmarks/results/validation.md --reproduce-budget "${ZOO_REPRODUCE_BUDGET:-120}")
[ "$budget" = none ] || args+=(--rebuild-budget "$budget")
.venv/bin/zoo validate "${args[@]}"
echo "validation wall time: $(( $(date +%s) - start )) s"
