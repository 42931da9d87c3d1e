#!/bin/bash
# The GPU/NCCL check, run on a machine with a CUDA GPU (not part of `make test`: CI has no GPU).
#   bash benchmarks/gpu_check.sh OUT_DIR
# Every torchrun launcher trains digits-cnn with --backend nccl on cuda; each run's summary.json is
# copied to OUT_DIR/<launcher>.json and a line per run goes to OUT_DIR/gpu_check.log.
set -u
OUT=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$OUT"
export ZOO_HOME=${ZOO_HOME:-/tmp/zoo-gpu-home} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
PY=${PYTHON:-python3}
NGPU=$($PY -c "import torch; print(torch.cuda.device_count())")
{ nvidia-smi -L; $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"; } | tee "$OUT/gpu_check.log"
QUICK="--recipe fp32 --model digits-cnn steps=16 optimizer.name=sgd optimizer.lr=0.05 quantization.scheme=none export.variants=[fp32] export.opsets=[17] --no-tracking --backend nccl"
check() {  # name nproc launcher extra...
  local name=$1 nproc=$2 launcher=$3; shift 3
  local start=$(date +%s)
  if $PY -m torch.distributed.run --standalone --nproc_per_node "$nproc" "launchers/$launcher" --output-dir "/tmp/gpu-$name" $QUICK "$@" >"/tmp/gpu-$name.log" 2>&1; then
    cp "/tmp/gpu-$name/summary.json" "$OUT/$name.json"
    echo "PASS $name ($nproc x GPU, $(( $(date +%s) - start )) s): $($PY -c "import json; s=json.load(open('/tmp/gpu-$name/summary.json')); p=s['phases']['fp32']; print('backend', s['backend'], 'loss', round(p['first_loss'],4), '->', round(p['final_loss'],4), 'onnx accuracy', s['variants']['fp32']['accuracy'], 'ranks consistent', p['ranks_consistent'])")" | tee -a "$OUT/gpu_check.log"
  else
    # the rank's own exception, not torchrun's summary of it
    echo "FAIL $name: $(grep -E '^\[rank[0-9]+\]: [A-Za-z.]*(Error|Exception)' "/tmp/gpu-$name.log" | tail -1)" | tee -a "$OUT/gpu_check.log"
  fi
}
N=$(( NGPU >= 2 ? 2 : 1 ))
check ddp "$N" ddp.py
check fsdp "$N" fsdp.py
check tp "$N" tensor_parallel.py
check fsdp-bf16 "$N" fsdp.py precision=bf16
if [ "$NGPU" -ge 2 ]; then check pp 2 pipeline.py; fi
