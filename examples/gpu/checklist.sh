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
#   matrix-*      the comparison matrix, bench-vit at batch 256 in bf16 (ViT-B/32 for the last two rows):
#                 euclip as is; without staging; one compute thread; file-system sharing; on OpenCLIP's
#                 pipeline; with the loaders taken out (one batch repeated); OpenCLIP's own trainer
#                 (py-spy records the first row, threads and subprocesses, where it installs)
#   bench         euclip bench train on the GPU: euclip against OpenCLIP on the same shards, and the MFU
#   loader        euclip bench loader with the workers, fed to the GPU: euclip's loader and OpenCLIP's alone
# OUT/summary.md collects the device, the versions, every figure and the matrix as one table.
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
# ---- the comparison matrix: each row one run of euclip's trainer (or OpenCLIP's) on the same shards
steps=${EUCLIP_MATRIX_STEPS:-40}
matrix_row() {  # matrix_row NAME ARCH BATCH OVERRIDES...: one euclip run of the matrix
    local name=$1 arch=$2 batch=$3; shift 3
    e train --recipe tiny-clip --runs-dir "$runs" --name "matrix-$name" data.train_dir="$world/train" \
        model.arch="$arch" data.batch_size="$batch" optim.samples=$((batch * steps)) optim.warmup_steps=2 \
        train.device=cuda train.precision=bf16 data.workers="$workers" train.log_every=1 train.checkpoints=1 \
        train.tensorboard=false "$@"
}
check matrix-as-is matrix_row as-is bench-vit 256
profile() {  # the first row again under py-spy (threads, subprocesses) where it installs; PY_SPY_WHEEL: a wheel
    if ! command -v py-spy >/dev/null; then
        pip install --quiet "${PY_SPY_WHEEL:-py-spy}" >/dev/null 2>&1 || { echo "py-spy did not install"; return 1; }
    fi
    py-spy record --threads --subprocesses --idle --rate 50 --format speedscope -o "$out/pyspy-as-is.json" -- \
        $EUCLIP train --recipe tiny-clip --runs-dir "$runs" --name pyspy-as-is data.train_dir="$world/train" \
        model.arch=bench-vit data.batch_size=256 optim.samples=$((256 * steps)) optim.warmup_steps=2 \
        train.device=cuda train.precision=bf16 data.workers="$workers" train.log_every=1 train.checkpoints=1 \
        train.tensorboard=false
}
check py-spy profile
check matrix-unstaged matrix_row unstaged bench-vit 256 data.staging=false
check matrix-one-thread matrix_row one-thread bench-vit 256 train.host_threads=1
check matrix-file-system matrix_row file-system bench-vit 256 data.sharing=file_system
check matrix-openclip-pipeline matrix_row openclip-pipeline bench-vit 256 data.pipeline=openclip
check matrix-loaders-out matrix_row loaders-out bench-vit 256 data.pipeline=repeat
check matrix-text-every-length matrix_row text-every-length bench-vit 256 model.text_groups=0
check matrix-vit-b32 matrix_row vit-b32 ViT-B-32 256
check bench e bench train --device cuda --workers "$workers" --steps 30 --rounds 2 --out "$out/bench"
check bench-vit-b32 e bench train --arch ViT-B-32 --device cuda --workers "$workers" --steps 20 --rounds 1 \
    --no-accumulation --no-tiny --out "$out/bench-vit-b32"
check loader e bench loader --workers "$workers" --device cuda --out "$out/bench"
printf '\n```\n' >>"$summary"; tail -n 8 "$out/logs/loader.log" >>"$summary"; printf '```\n' >>"$summary"

python - "$runs" "$summary" "$out" <<'EOF'
import json, statistics, sys
from pathlib import Path
runs, summary, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])


def median(values):
    return statistics.median(values) if values else None


def described(run):
    """A run's figures after its first two (warm-up) records."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = [r for r in records if r["step"] > 2] or records
    loader = [r for r in timed if "loader_samples_per_s" in r]
    return {"steps": records[-1]["step"], "loss": records[-1]["loss"], "scale": records[-1].get("loss_scale", "-"),
            "median": median([r["samples_per_s"] for r in timed]),
            # the timed steps' samples over their time: batches come in clumps, one per worker
            "overall": statistics.harmonic_mean([r["samples_per_s"] for r in timed]),
            "wait": median([r["data_wait_share"] for r in timed]),
            "could": median([r["loader_samples_per_s"] for r in loader]),
            "cpu": median([r["loader_cpu_share"] for r in loader]),
            "gpu": max(r.get("gpu_peak_mib", 0) for r in records)}


lines = ["", "| run | steps | last loss | samples/s (median step) | waiting for data (median) "
         "| loaders could give, samples/s (their CPU share) | peak GPU MiB | loss scale |",
         "|---|---|---|---|---|---|---|---|"]
matrix = {}
for run in sorted(p for p in runs.iterdir() if (p / "metrics.jsonl").exists()):
    d = described(run)
    if run.name.startswith("matrix-"):
        matrix[run.name.removeprefix("matrix-")] = d
        continue
    could = f"{d['could']:.0f} ({d['cpu']:.0%})" if d["could"] else "-"
    lines.append(f"| {run.name} | {d['steps']} | {d['loss']:.3f} | {d['median']:.0f} | {d['wait']:.0%} | {could} | "
                 f"{d['gpu']:.0f} | {d['scale']} |")
# OpenCLIP's trainer, from the benches' results (the same shards, workers and precision).
for name, folder in (("openclip-trainer", "bench"), ("openclip-trainer-vit-b32", "bench-vit-b32")):
    found = sorted((out / folder).glob("train-*.json"))
    if found:
        m = json.loads(found[-1].read_text())["measurements"]["openclip"]
        matrix[name] = {"median": m["samples_per_s"], "overall": m.get("overall_samples_per_s"),
                        "wait": m.get("data_wait_share"), "could": None, "cpu": None, "gpu": None}
lines += ["", "The matrix (bench-vit, batch 256, bf16; ViT-B/32 where named): samples/s over the timed steps",
          "", "| row | samples/s (all timed steps) | median step | x as is | waiting for data | loaders could give "
          "(CPU) | peak GPU MiB |", "|---|---|---|---|---|---|---|"]
base = matrix.get("as-is", {}).get("overall")
for name, d in matrix.items():
    ratio = f"{d['overall'] / base:.2f}" if base and d.get("overall") else "-"
    could = f"{d['could']:.0f} ({d['cpu']:.0%})" if d.get("could") else "-"
    wait = f"{d['wait']:.0%}" if d.get("wait") is not None else "-"
    overall = f"{d['overall']:.0f}" if d.get("overall") else "-"
    gpu = f"{d['gpu']:.0f}" if d.get("gpu") else "-"
    lines.append(f"| {name} | {overall} | {d['median']:.0f} | {ratio} | {wait} | {could} | {gpu} |")
with summary.open("a") as f:
    f.write("\n".join(lines) + "\n")
EOF
cat "$summary"
exit $status
