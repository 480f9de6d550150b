#!/bin/bash
# The GPU checklist: everything a first real run needs, on one GPU, on the embedded world and on
# DataComp-like 512-px JPEG shards, in about ten minutes.
#
#   examples/gpu/checklist.sh results/gpu-checklist          # from the euclip checkout, .venv active
#   EUCLIP="python -m euclip_cli" examples/gpu/checklist.sh OUT   # without the console script
#
# From a bare machine with its own Python and torch and no network (the lent GPU machines): build the
# wheelhouse where there is a network, `make wheelhouse WHEELHOUSE=.whl` (docs/install.md; 45 MiB for
# examples/gpu/target-packages.txt), bring .whl along with the checkout, and run
#   EUCLIP_WHEELHOUSE=.whl examples/gpu/checklist.sh OUT
# which installs euclip from it into OUT/site first (the install row) and runs everything with that.
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
#   jpeg-*        on DataComp-like JPEG shards (euclip download datacomp-like): ViT-B/32 at batch 256 in the
#                 matrix (decoder pil, pil-draft, decoded on the GPU, loaders out), OpenCLIP's trainer on the same shards
#                 (bench train --shards), and the loaders alone
#   plan, vit-b32-checkpointed   the memory plan of medium-euclip (euclip train --plan), and the vit-b32 row
#                 again with train.grad_checkpointing=true: its peak GPU memory beside the row without
# EUCLIP_NO_GPU=1 runs only the rows that need no GPU (install, world, jpeg-shards, plan): a rehearsal on
# any machine (tests/test_examples.py runs it), with EUCLIP_WORLD_SAMPLES and EUCLIP_JPEG_SAMPLES to size it.
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
if [ -n "${EUCLIP_WHEELHOUSE:-}" ]; then
    site=$out/site
    # --target: the machine's own site-packages stay as they are; euclip and what it lacks go beside them.
    sh "$EUCLIP_WHEELHOUSE/install.sh" --target "$site" >"$out/logs/install.log" 2>&1 \
        && echo "ok      install (wheelhouse $EUCLIP_WHEELHOUSE)" \
        || { echo "FAILED  install: tail of logs/install.log:"; tail -n 15 "$out/logs/install.log"; exit 1; }
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    EUCLIP="python3 -m euclip_cli"
fi
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

check world e download world --out "$world" --samples "${EUCLIP_WORLD_SAMPLES:-40000}" --eval-size 500 \
    --workers "$(nproc)"
jpeg=$out/jpeg
check jpeg-shards e download datacomp-like --out "$jpeg" --samples "${EUCLIP_JPEG_SAMPLES:-4000}" --workers "$(nproc)"
check plan e train --recipe medium-euclip --plan
if [ -z "${EUCLIP_NO_GPU:-}" ]; then
check train-bf16 preempt_and_resume
check train-fp16 e train --recipe tiny-clip --runs-dir "$runs" --name gpu-fp16 data.train_dir="$world/train" \
    train.device=cuda train.precision=fp16 data.workers="$workers" train.log_every=4
check eval e eval "$runs/gpu-bf16" --world "$world" --device cuda
vit_b32() {  # vit_b32 NAME OVERRIDES...: ViT-B/32 at batch 512 on the world, its peak GPU memory in the summary
    local name=$1; shift
    e train --recipe tiny-clip --runs-dir "$runs" --name "$name" data.train_dir="$world/train" \
        model.arch=ViT-B-32 data.batch_size=512 optim.samples=30720 optim.warmup_steps=10 train.device=cuda \
        train.precision=bf16 data.workers="$workers" train.log_every=5 train.checkpoints=1 "$@"
}
check vit-b32 vit_b32 gpu-vit-b32
check vit-b32-checkpointed vit_b32 gpu-vit-b32-checkpointed train.grad_checkpointing=true
# ---- the comparison matrix: each row one run of euclip's trainer (or OpenCLIP's) on the same shards
steps=${EUCLIP_MATRIX_STEPS:-40}
matrix_row() {  # matrix_row NAME ARCH BATCH OVERRIDES...: one euclip run of the matrix (on TRAIN_DIR if set)
    local name=$1 arch=$2 batch=$3; shift 3
    e train --recipe tiny-clip --runs-dir "$runs" --name "matrix-$name" data.train_dir="${TRAIN_DIR:-$world/train}" \
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
# The profile of the first row is opt-in (EUCLIP_PYSPY=1): it keeps the checklist inside ten minutes.
[ -n "${EUCLIP_PYSPY:-}" ] && check py-spy profile
check matrix-unstaged matrix_row unstaged bench-vit 256 data.staging=false
check matrix-one-thread matrix_row one-thread bench-vit 256 train.host_threads=1
check matrix-file-system matrix_row file-system bench-vit 256 data.sharing=file_system
check matrix-openclip-pipeline matrix_row openclip-pipeline bench-vit 256 data.pipeline=openclip
check matrix-loaders-out matrix_row loaders-out bench-vit 256 data.pipeline=repeat
check matrix-text-every-length matrix_row text-every-length bench-vit 256 model.text_groups=0
check matrix-vit-b32 matrix_row vit-b32 ViT-B-32 256
jpeg_row() { TRAIN_DIR=$jpeg matrix_row "$@"; }  # the same rows on the JPEG shards
check matrix-jpeg-vit-b32 jpeg_row jpeg-vit-b32 ViT-B-32 256
check matrix-jpeg-draft jpeg_row jpeg-draft ViT-B-32 256 data.decoder=pil-draft
check matrix-jpeg-device-decode jpeg_row jpeg-device-decode ViT-B-32 256 data.decode=device
check matrix-jpeg-loaders-out jpeg_row jpeg-loaders-out ViT-B-32 256 data.pipeline=repeat
check bench e bench train --device cuda --workers "$workers" --steps 30 --rounds 2 --out "$out/bench"
check bench-vit-b32 e bench train --arch ViT-B-32 --device cuda --workers "$workers" --steps 20 --rounds 1 \
    --no-accumulation --no-tiny --out "$out/bench-vit-b32"
check loader e bench loader --workers "$workers" --device cuda --out "$out/bench"
check jpeg-bench-vit-b32 e bench train --arch ViT-B-32 --shards "$jpeg" --device cuda --workers "$workers" --steps 20 \
    --rounds 1 --no-accumulation --no-tiny --out "$out/bench-jpeg"
check jpeg-loader e bench loader --shards "$jpeg" --workers "$workers" --device cuda --out "$out/bench-jpeg"
fi
for log in loader jpeg-loader plan; do
    [ -e "$out/logs/$log.log" ] || continue
    printf '\n```\n' >>"$summary"; tail -n 8 "$out/logs/$log.log" >>"$summary"; printf '```\n' >>"$summary"
done

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
for run in sorted(p for p in (runs.iterdir() if runs.exists() else ()) if (p / "metrics.jsonl").exists()):
    d = described(run)
    if run.name.startswith("matrix-"):
        matrix[run.name.removeprefix("matrix-")] = d
        continue
    could = f"{d['could']:.0f} ({d['cpu']:.0%})" if d["could"] else "-"
    lines.append(f"| {run.name} | {d['steps']} | {d['loss']:.3f} | {d['median']:.0f} | {d['wait']:.0%} | {could} | "
                 f"{d['gpu']:.0f} | {d['scale']} |")
# OpenCLIP's trainer, from the benches' results (the same shards, workers and precision).
for name, folder in (("openclip-trainer", "bench"), ("openclip-trainer-vit-b32", "bench-vit-b32"),
                     ("openclip-trainer-jpeg-vit-b32", "bench-jpeg")):
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
