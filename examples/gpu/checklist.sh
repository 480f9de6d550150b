#!/bin/bash
# The GPU checklist: everything a first real run needs, on one GPU, on the embedded world, in ~10 minutes.
#
#   examples/gpu/checklist.sh results/gpu-checklist          # from the euclip checkout, .venv active
#   EUCLIP="python -m euclip_cli" examples/gpu/checklist.sh OUT   # without the console script
#
# Checks, each reported as ok or FAILED with its log in OUT/logs (the script goes on after a failure):
#   train-bf16    tiny-clip on the GPU in bf16, preempted by SIGTERM part-way, then the same command resumes
#   train-fp16    the same in fp16 with the gradient scaler, uninterrupted (its loss scale is logged)
#   eval          the bf16 run's zero-shot evaluation on the GPU
#   vit-b32       ViT-B/32 at 224 px on the world's shards with loader workers: samples/s and peak GPU memory
#   bench         euclip bench train on the GPU: euclip against OpenCLIP on the same shards, and the MFU
#   loader        euclip bench loader with the workers, pinned: what the loader alone delivers there
#   handover      examples/gpu/handover.py: whether handing batches over holds the trainer back
# OUT/summary.md collects the device, the versions and every figure.
set -uo pipefail

out=${1:?usage: examples/gpu/checklist.sh OUT_DIR}
EUCLIP=${EUCLIP:-euclip}
workers=${EUCLIP_WORKERS:-8}
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
runs=$out/runs
world=$out/world
summary=$out/summary.md
e() { $EUCLIP "$@"; }

status=0
check() {  # check NAME COMMAND...: run, log, report
    local name=$1; shift
    local started=$SECONDS
    "$@" >"$out/logs/$name.log" 2>&1
    local code=$?
    if [ $code -eq 0 ]; then
        echo "| $name | ok | $((SECONDS - started)) s |" >>"$summary"
        echo "ok      $name ($((SECONDS - started)) s)"
    else
        status=1
        echo "| $name | FAILED (exit $code; logs/$name.log) | $((SECONDS - started)) s |" >>"$summary"
        echo "FAILED  $name: tail of logs/$name.log:"
        tail -n 15 "$out/logs/$name.log"
    fi
}

{
    echo "# GPU checklist"
    echo
    echo '```'
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python -c "import torch, open_clip; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| open_clip', open_clip.__version__)"
    lscpu | grep -m1 'Model name'
    echo "cores: $(nproc); git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo '```'
    echo
    echo "| check | result | wall |"
    echo "|---|---|---|"
} >"$summary"

preempt_and_resume() {
    local common=(--recipe tiny-clip --runs-dir "$runs" --name gpu-bf16 data.train_dir="$world/train"
                  train.device=cuda train.precision=bf16 data.workers="$workers" train.checkpoints=4
                  train.log_every=4)
    # In its own process group, which SIGTERM reaches whole (loader workers included), as SLURM's
    # preemption warning reaches every process of a job step.
    setsid $EUCLIP train "${common[@]}" &
    local pid=$!
    # SIGTERM once the first checkpoint exists: the run must finish its step, checkpoint and exit 1.
    until [ -e "$runs/gpu-bf16/checkpoints/latest" ] || ! kill -0 $pid 2>/dev/null; do sleep 0.5; done
    kill -TERM -- -$pid 2>/dev/null
    wait $pid
    local code=$?
    echo "first run exit: $code (1 = stopped by the signal with a checkpoint)"
    [ $code -eq 1 ] || return 1
    e train "${common[@]}" | tee "$out/logs/train-bf16-resume.log"
    grep -q "resumed from" "$out/logs/train-bf16-resume.log"
}

check world e download world --out "$world" --samples 40000 --eval-size 500 --workers "$(nproc)"
check train-bf16 preempt_and_resume
check train-fp16 e train --recipe tiny-clip --runs-dir "$runs" --name gpu-fp16 data.train_dir="$world/train" \
    train.device=cuda train.precision=fp16 data.workers="$workers" train.log_every=4
check eval e eval "$runs/gpu-bf16" --world "$world" --device cuda
check vit-b32 e train --recipe tiny-clip --runs-dir "$runs" --name gpu-vit-b32 data.train_dir="$world/train" \
    model.arch=ViT-B-32 data.batch_size=512 optim.samples=30720 optim.warmup_steps=10 train.device=cuda \
    train.precision=bf16 data.workers="$workers" train.log_every=5 train.checkpoints=1
check bench e bench train --device cuda --workers "$workers" --steps 20 --rounds 2 --out "$out/bench"
check loader e bench loader --workers "$workers" --pin-memory --out "$out/bench"
check handover python "$(dirname "$0")/handover.py" --workers "$workers" --batches $((4 * workers)) \
    --scratch "$out/bench/scratch"
for log in loader handover; do
    printf '\n```\n' >>"$summary"; tail -n 12 "$out/logs/$log.log" >>"$summary"; printf '```\n' >>"$summary"
done

python - "$runs" "$summary" <<'EOF'
import json, sys
from pathlib import Path
runs, summary = Path(sys.argv[1]), Path(sys.argv[2])
lines = ["", "| run | steps | last loss | samples/s (median of logged windows) | waiting for data (median) "
         "| loaders could give, samples/s (their CPU share) | peak GPU MiB | loss scale |",
         "|---|---|---|---|---|---|---|---|"]
for run in sorted(p for p in runs.iterdir() if (p / "metrics.jsonl").exists()):
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if not records:
        continue
    timed = records[1:] or records
    rates = sorted(r["samples_per_s"] for r in timed)
    waits = sorted(r["data_wait_share"] for r in timed)
    loaders = sorted((r["loader_samples_per_s"], r["loader_cpu_share"]) for r in timed if "loader_samples_per_s" in r)
    loader = f"{loaders[len(loaders) // 2][0]:.0f} ({loaders[len(loaders) // 2][1]:.0%})" if loaders else "-"
    last = records[-1]
    lines.append(f"| {run.name} | {last['step']} | {last['loss']:.3f} | {rates[len(rates) // 2]:.0f} | "
                 f"{waits[len(waits) // 2]:.0%} | {loader} | {max(r.get('gpu_peak_mib', 0) for r in records):.0f} | "
                 f"{last.get('loss_scale', '-')} |")
with summary.open("a") as f:
    f.write("\n".join(lines) + "\n")
EOF
cat "$summary"
exit $status
