#!/usr/bin/env bash
# CI's validation pipeline: re-measure every variant of every catalog entry against its card.
# Files come from the configured LFS stores (ZOO_LFS_URL; the Makefile points it at a published store laid
# beside the checkout when there is one), else each entry is rebuilt from its recipe in a scratch folder.
# Writes benchmarks/results/validation.{md,json} (the docs show it); exits non-zero on any failed check.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
.venv/bin/zoo validate --all --report benchmarks/results/validation.md
echo "validation wall time: $(( $(date +%s) - start )) s"
