#!/bin/bash
# The GPU checklist, in parts in order of value, each within 8 minutes of one GPU (the estimates and
# the CPU rehearsal's times are in docs/training.md, "The GPU checklist"). One part per call keeps
# every finished part's files in OUT whatever a later part does; a part run again measures again.
#
#   examples/gpu/checklist.sh OUT [--part N]...     # no --part: every part, in order
#
# From a bare lent machine (its own Python and torch, no network): build the wheelhouse where there is
# a network, `make wheelhouse WHEELHOUSE=.whl` (docs/install.md), bring .whl with the checkout, and run
#   EUCLIP_WHEELHOUSE=.whl examples/gpu/checklist.sh OUT --part 1
# Before its first part every call runs the setup, which skips what OUT already holds:
#   install  euclip from the wheelhouse into OUT/site (PYTHONPATH points there first, so that the
#            install's own check finds what it installed), with python3 or $PYTHON
#   machine  the machine's pip list (OUT/machine.txt) and its GPU, torch and CPU (the summary's head)
#   smoke    a tiny run trained and evaluated on the CPU: the install's check leaves the packages whose
#            version the target file could not know (pandas, opencv) to this test of euclip itself;
#            when it fails, no part runs
# The parts:
#   1  euclip against OpenCLIP's trainer on DataComp-like 512-px JPEG shards at ViT-B/32 (euclip bench
#      train --shards: both trainers in interleaved rounds), and euclip's trainer on them (a matrix row)
#   2  decode on the device: the JPEG row with pil-draft, with data.decode=device, and with the loaders out
#   3  compile on and off, in one call: the JPEG row uncompiled, then compiled, and device decode compiled
#   4  memory against the plan: ViT-B/32 at batch 256 and 512, checkpointing off and on, each peak
#      beside `euclip train --plan`'s figure for the same run, and medium-euclip's plan
#   5  the loader alone at 16 workers, fed to the GPU, on the JPEG shards and on the world
#   6  the trainer on the GPU: tiny-clip preempted by SIGTERM and resumed in bf16, fp16 with its scaler,
#      evaluation on the GPU, and euclip bench train on the world (against OpenCLIP, with accumulation)
#   7  the bench-vit matrix on the world: as is, unstaged, one thread, file_system sharing, OpenCLIP's
#      pipeline, loaders out, every caption length its own group, ViT-B/32; py-spy on the first row
#      where EUCLIP_PYSPY=1
# EUCLIP_NO_GPU=1 runs only what needs no GPU (the setup, the shards, the plans): the lent machine's
# rehearsal (tests/test_lent_machine.py). EUCLIP_DEVICE=cpu runs every row on the CPU at a
# rehearsal's sizes (EUCLIP_BATCH, EUCLIP_STEPS, EUCLIP_WORKERS and the samples below override them).
# OUT/summary.md collects the machine, every row, every run's figures and the matrix, after each call.
set -uo pipefail

usage="usage: examples/gpu/checklist.sh OUT [--part N]...   (N: 1 to 7)"
out=${1:?$usage}
shift
parts=()
while [ $# -gt 0 ]; do
    case $1 in
        --part) [[ ${2:-} =~ ^[1-7]$ ]] || { echo "error: --part takes 1 to 7, not '${2:-}'; $usage" >&2; exit 2; }
                parts+=("$2"); shift 2 ;;
        *) echo "error: unknown argument '$1'; $usage" >&2; exit 2 ;;
    esac
done
[ ${#parts[@]} -gt 0 ] || parts=(1 2 3 4 5 6 7)

PY=${PYTHON:-python3}
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
runs=$out/runs
world=$out/world
jpeg=$out/jpeg
checks=$out/checks.md
summary=$out/summary.md

device=${EUCLIP_DEVICE:-cuda}
if [ "$device" = cpu ]; then  # a rehearsal: every command line runs, at sizes a CPU finishes
    batch=${EUCLIP_BATCH:-8}; steps=${EUCLIP_STEPS:-2}; workers=${EUCLIP_WORKERS:-2}; loader_workers=$workers
    world_samples=${EUCLIP_WORLD_SAMPLES:-600}; jpeg_samples=${EUCLIP_JPEG_SAMPLES:-60}
    bench_steps=1; bench_rounds=1
    # tiny-clip's own 32,768 samples are 18 minutes in fp16 on a CPU (autocast emulates it): 16 steps do.
    tiny=(optim.samples=2048)
else
    batch=${EUCLIP_BATCH:-256}; steps=${EUCLIP_STEPS:-40}; workers=${EUCLIP_WORKERS:-8}; loader_workers=16
    world_samples=${EUCLIP_WORLD_SAMPLES:-40000}; jpeg_samples=${EUCLIP_JPEG_SAMPLES:-4000}
    bench_steps=20; bench_rounds=2
    tiny=()
fi

fail() { echo "FAILED  $1"; exit 1; }

# ---- setup: the install first, then the environment it needs
if [ -n "${EUCLIP_WHEELHOUSE:-}" ]; then
    site=$out/site
    # Before the install: its check imports what it installed, from here.
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    if [ ! -e "$site/.installed" ]; then
        started=$SECONDS
        # --target: the machine's own site-packages stay as they are; euclip and what it lacks go beside.
        PYTHON=$PY sh "$EUCLIP_WHEELHOUSE/install.sh" --target "$site" >"$out/logs/install.log" 2>&1 \
            || { tail -n 15 "$out/logs/install.log"; fail "install: tail of logs/install.log above"; }
        touch "$site/.installed"
        echo "ok      install from $EUCLIP_WHEELHOUSE ($((SECONDS - started)) s)"
        grep '^unverified:' "$out/logs/install.log"
    fi
    EUCLIP="$PY -m euclip_cli"
fi
if [ -z "${EUCLIP:-}" ]; then
    EUCLIP=euclip
    command -v euclip >/dev/null || EUCLIP="$PY -m euclip_cli"
fi
e() { $EUCLIP "$@"; }
[ -e "$out/machine.txt" ] || "$PY" -m pip list --format=freeze >"$out/machine.txt" 2>/dev/null

status=0
check() {  # check NAME COMMAND...: run, log, report (a row in OUT/checks.md, replacing an earlier one)
    local name=$1; shift
    local started=$SECONDS
    "$@" >"$out/logs/$name.log" 2>&1
    local code=$? row
    if [ $code -eq 0 ]; then
        row="| $name | ok | $((SECONDS - started)) s |"
        echo "ok      $name ($((SECONDS - started)) s)"
    else
        status=1
        row="| $name | FAILED (exit $code; logs/$name.log) | $((SECONDS - started)) s |"
        echo "FAILED  $name: tail of logs/$name.log:"
        tail -n 15 "$out/logs/$name.log"
    fi
    { grep -v "^| $name |" "$checks" 2>/dev/null; echo "$row"; } >"$checks.new"; mv "$checks.new" "$checks"
    return $code
}
gpu() {  # gpu NAME COMMAND...: a check that needs the GPU (skipped under EUCLIP_NO_GPU)
    [ -n "${EUCLIP_NO_GPU:-}" ] && return 0
    check "$@"
}

smoke() {  # a tiny run trained and evaluated on the CPU, on a small world of its own
    e download world --out "$out/smoke/world" --samples 600 --eval-size 100 --workers 2 \
        && e train --recipe tiny-clip --runs-dir "$out/smoke/runs" --name smoke data.train_dir="$out/smoke/world/train" \
            train.device=cpu data.batch_size=16 optim.samples=64 optim.warmup_steps=1 train.precision=fp32 \
            train.tensorboard=false \
        && e eval "$out/smoke/runs/smoke" --world "$out/smoke/world" --device cpu --tasks world:main
}
if [ ! -e "$out/smoke/.passed" ]; then
    rm -rf "$out/smoke"
    check smoke smoke || fail "smoke: euclip does not run with this machine's packages; no part runs (logs/smoke.log)"
    touch "$out/smoke/.passed"
fi

# ---- what the parts share, made once per OUT
need_world() {
    [ -e "$world/.done" ] && return 0
    rm -rf "$world"
    check world e download world --out "$world" --samples "$world_samples" --eval-size 500 --workers "$(nproc)" \
        && touch "$world/.done"
}
need_jpeg() {
    [ -e "$jpeg/.done" ] && return 0
    rm -rf "$jpeg"
    check jpeg-shards e download datacomp-like --out "$jpeg" --samples "$jpeg_samples" --workers "$(nproc)" \
        && touch "$jpeg/.done"
}

train_row() {  # train_row NAME DIR ARCH BATCH OVERRIDES...: one run of euclip's trainer, measured again if it exists
    local name=$1 dir=$2 arch=$3 size=$4; shift 4
    rm -rf "$runs/$name"
    e train --recipe tiny-clip --runs-dir "$runs" --name "$name" data.train_dir="$dir" model.arch="$arch" \
        data.batch_size="$size" optim.samples=$((size * steps)) optim.warmup_steps=2 train.device="$device" \
        train.precision=bf16 data.workers="$workers" train.log_every=1 train.checkpoints=1 train.tensorboard=false "$@"
}
matrix() { local name=$1; shift; train_row "matrix-$name" "$world/train" "$@"; }
jpeg_row() { local name=$1; shift; train_row "matrix-jpeg-$name" "$jpeg" ViT-B-32 "$batch" "$@"; }
bench_jpeg() {  # bench_jpeg OUT_NAME FLAGS...: euclip against OpenCLIP's trainer on the JPEG shards, ViT-B/32
    local name=$1; shift
    e bench train --arch ViT-B-32 --shards "$jpeg" --batch-size "$batch" --device "$device" --workers "$workers" \
        --steps "$bench_steps" --rounds "$bench_rounds" --no-accumulation --no-tiny --out "$out/$name" "$@"
}
plan_row() {  # plan_row NAME BATCH OVERRIDES...: the memory plan of a ViT-B/32 row, then the row itself
    local name=$1 size=$2; shift 2
    e train --recipe tiny-clip data.train_dir="$world/train" model.arch=ViT-B-32 data.batch_size="$size" \
        train.precision=bf16 "$@" --plan | tee "$out/logs/plan-$name.log" || return 1
    [ -n "${EUCLIP_NO_GPU:-}" ] || train_row "memory-$name" "$world/train" ViT-B-32 "$size" "$@"
}

part1() {
    need_jpeg || return
    gpu bench-jpeg-vit-b32 bench_jpeg bench-jpeg
    gpu matrix-jpeg-vit-b32 jpeg_row vit-b32
}
part2() {
    need_jpeg || return
    gpu matrix-jpeg-draft jpeg_row draft data.decoder=pil-draft
    gpu matrix-jpeg-device-decode jpeg_row device-decode data.decode=device
    gpu matrix-jpeg-loaders-out jpeg_row loaders-out data.pipeline=repeat
}
part3() {
    need_jpeg || return
    gpu matrix-jpeg-compile-off jpeg_row compile-off
    gpu matrix-jpeg-compiled jpeg_row compiled train.compile=true
    gpu matrix-jpeg-device-decode-compiled jpeg_row device-decode-compiled data.decode=device train.compile=true
}
part4() {
    need_world || return
    check plan-medium-euclip e train --recipe medium-euclip --plan
    local size
    for size in "$batch" $((2 * batch)); do
        check "memory-b$size" plan_row "b$size" "$size"
        check "memory-b$size-checkpointed" plan_row "b$size-checkpointed" "$size" train.grad_checkpointing=true
    done
}
part5() {
    need_jpeg && gpu loader-jpeg e bench loader --shards "$jpeg" --workers "$loader_workers" --device "$device" \
        --out "$out/bench-loader-jpeg"
    need_world && gpu loader-world e bench loader --workers "$loader_workers" --device "$device" \
        --out "$out/bench-loader-world"
}
preempt_and_resume() {
    local common=(--recipe tiny-clip --runs-dir "$runs" --name gpu-bf16 data.train_dir="$world/train"
                  train.device="$device" train.precision=bf16 data.workers="$workers" train.checkpoints=4
                  train.log_every=4 "${tiny[@]}")
    rm -rf "$runs/gpu-bf16"
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
profile() {  # the first matrix row under py-spy (threads, subprocesses) where it installs; PY_SPY_WHEEL: a wheel
    if ! command -v py-spy >/dev/null; then
        "$PY" -m pip install --quiet "${PY_SPY_WHEEL:-py-spy}" >/dev/null 2>&1 || { echo "py-spy did not install"; return 1; }
    fi
    py-spy record --threads --subprocesses --idle --rate 50 --format speedscope -o "$out/pyspy-as-is.json" -- \
        $EUCLIP train --recipe tiny-clip --runs-dir "$runs" --name pyspy-as-is data.train_dir="$world/train" \
        model.arch=bench-vit data.batch_size="$batch" optim.samples=$((batch * steps)) optim.warmup_steps=2 \
        train.device="$device" train.precision=bf16 data.workers="$workers" train.log_every=1 train.checkpoints=1 \
        train.tensorboard=false
}
part6() {
    need_world || return
    gpu train-bf16 preempt_and_resume
    rm -rf "$runs/gpu-fp16"
    gpu train-fp16 e train --recipe tiny-clip --runs-dir "$runs" --name gpu-fp16 data.train_dir="$world/train" \
        train.device="$device" train.precision=fp16 data.workers="$workers" train.log_every=4 "${tiny[@]}"
    gpu eval e eval "$runs/gpu-bf16" --world "$world" --device "$device"
    gpu bench e bench train --device "$device" --workers "$workers" --steps "$bench_steps" --rounds "$bench_rounds" \
        --out "$out/bench"
}
part7() {
    need_world || return
    gpu matrix-as-is matrix as-is bench-vit "$batch"
    [ -n "${EUCLIP_PYSPY:-}" ] && gpu py-spy profile
    gpu matrix-unstaged matrix unstaged bench-vit "$batch" data.staging=false
    gpu matrix-one-thread matrix one-thread bench-vit "$batch" train.host_threads=1
    gpu matrix-file-system matrix file-system bench-vit "$batch" data.sharing=file_system
    gpu matrix-openclip-pipeline matrix openclip-pipeline bench-vit "$batch" data.pipeline=openclip
    gpu matrix-loaders-out matrix loaders-out bench-vit "$batch" data.pipeline=repeat
    gpu matrix-text-every-length matrix text-every-length bench-vit "$batch" model.text_groups=0
    gpu matrix-vit-b32 matrix vit-b32 ViT-B-32 "$batch"
}

for part in "${parts[@]}"; do
    started=$SECONDS
    echo "part $part"
    "part$part"
    echo "part $part: $((SECONDS - started)) s"
    { grep -v "^part $part:" "$out/logs/parts.log" 2>/dev/null; echo "part $part: $((SECONDS - started)) s"; } \
        | sort >"$out/logs/parts.new"
    mv "$out/logs/parts.new" "$out/logs/parts.log"
done

# ---- the summary, from everything OUT holds (every part run so far)
{
    echo "# GPU checklist"
    echo
    echo '```'
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU (nvidia-smi)"
    "$PY" -c "import torch, open_clip; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| open_clip', open_clip.__version__)"
    lscpu | grep -m1 'Model name'
    echo "cores: $(nproc); git: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); device: $device"
    echo '```'
    echo
    echo "| check | result | wall |"
    echo "|---|---|---|"
    cat "$checks" 2>/dev/null
    cat "$out/logs/parts.log" 2>/dev/null | sed 's/^/    /'
} >"$summary"
for log in loader-jpeg loader-world plan-medium-euclip; do
    [ -e "$out/logs/$log.log" ] || continue
    printf '\n```\n' >>"$summary"; tail -n 8 "$out/logs/$log.log" >>"$summary"; printf '```\n' >>"$summary"
done
"$PY" "$(dirname "$0")/summarize.py" "$runs" "$summary" "$out"
cat "$summary"
exit $status
