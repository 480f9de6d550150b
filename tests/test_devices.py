"""Device handling where a GPU run would break: checkpoints read on the CPU, ``cuda:N`` per rank."""

from pathlib import Path

import pytest
import torch

from euclip_cli import config as C
from euclip_cli import rundir
from euclip_cli.device import cpu_name, resolve_device, resolve_precision
from euclip_cli.errors import UsageError
from euclip_cli.rundir import RunDir, load_checkpoint
from euclip_cli.train import loop

TINY = ["data.batch_size=16", "optim.warmup_steps=1", "train.precision=fp32", "train.log_every=1",
        "train.tensorboard=false", "data.shuffle_buffer=50", "train.checkpoints=2"]


def test_a_checkpoint_read_onto_an_accelerator_breaks_the_rng_restore(world, tmp_path):
    """Why resume reads on the CPU: a checkpoint mapped onto another device (the meta device stands in
    for a GPU) carries its RNG state there, and ``set_rng_state`` refuses it."""
    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=32", *TINY])
    loop.run(cfg, tmp_path / "run")
    path = RunDir(tmp_path / "run").latest_checkpoint()
    moved = torch.load(path, map_location="meta", weights_only=True)
    with pytest.raises(TypeError, match="ByteTensor"):
        torch.set_rng_state(moved["rng_torch"])
    torch.set_rng_state(load_checkpoint(path)["rng_torch"])  # what the trainer does


def test_resume_and_evaluation_read_checkpoints_on_the_cpu(world, tmp_path, monkeypatch):
    from euclip_cli.encode import load_model

    seen = []
    real = torch.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("map_location"))
        return real(*args, **kwargs)

    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=64", *TINY])
    loop.run(cfg, tmp_path / "run", on_step=lambda step, total, record: None)
    monkeypatch.setattr(torch, "load", spy)
    # A longer budget in the same run directory is another configuration, so resume a copy of its
    # first half: delete the final checkpoint and let the same command continue from the middle.
    run = RunDir(tmp_path / "run")
    middle, final = run.checkpoints()
    final.unlink()
    (run.checkpoints_dir / "latest").write_text(middle.name)
    summary = loop.run(cfg, tmp_path / "run")
    assert summary["branch"].startswith("resumed from") and summary["steps"] == 4
    load_model(run, torch.device("cpu"))
    assert seen and all(location == "cpu" for location in seen)


class FakeCuda:
    """A machine with ``count`` GPUs, as far as ``resolve_device`` can tell."""

    def __init__(self, monkeypatch, count):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_each_rank_takes_its_own_gpu_and_an_explicit_index_under_torchrun_is_refused(monkeypatch):
    FakeCuda(monkeypatch, 4)
    assert resolve_device("auto", local_rank=2, world=4) == torch.device("cuda", 2)
    assert resolve_device("cuda", local_rank=3, world=4) == torch.device("cuda", 3)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)  # one process may pick its GPU
    with pytest.raises(UsageError, match="every rank on GPU 1"):
        resolve_device("cuda:1", local_rank=0, world=4)
    with pytest.raises(UsageError, match="has 4 GPU"):
        resolve_device("cuda:7")


@pytest.mark.parametrize("amx, avx512_bf16, expected", [(True, False, "bf16"), (False, True, "bf16"), (False, False, "fp32")])
def test_auto_precision_on_a_cpu_is_bf16_only_with_bf16_units(monkeypatch, amx, avx512_bf16, expected):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == expected
    assert [resolve_precision(p, cpu) for p in ("fp32", "bf16", "fp16")] == ["fp32", "bf16", "fp16"]


@pytest.mark.parametrize("bf16, expected", [(True, "bf16"), (False, "fp16")])
def test_auto_precision_on_a_gpu_is_bf16_or_fp16_with_its_scaler(monkeypatch, bf16, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16)
    assert resolve_precision("auto", torch.device("cuda", 0)) == expected


def test_a_run_keeps_auto_in_its_config_and_records_what_it_chose(world, tmp_path, monkeypatch):
    """The config stays ``auto`` (a resume on another machine is the same configuration); meta.json and
    the summary say what this machine ran, here a CPU made to report AMX."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=16", *TINY,
                                      "train.precision=auto"])
    result = loop.run(cfg, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    assert result["precision"] == "bf16" and run.meta()["precision"] == "bf16"
    assert run.config()["train"]["precision"] == "auto"


def test_devices_a_machine_cannot_use_are_one_line_usage_errors(monkeypatch):
    FakeCuda(monkeypatch, 0)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(UsageError, match="no CUDA GPU"):
        resolve_device("cuda")
    with pytest.raises(UsageError, match="not a device"):
        resolve_device("gpu0")
    with pytest.raises(UsageError, match="cpu or cuda"):
        resolve_device("meta")


def test_a_cpu_is_named_with_its_family_and_model_as_lscpu_reads_them(tmp_path):
    """Two machines the kernel names alike ("AMD EPYC") are told apart by their family and model numbers,
    read from the first processor's block; against lscpu's own reading of this machine where it has one."""
    import shutil
    import subprocess

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                    "model name\t: AMD EPYC\nflags\t\t: avx2 avx512_bf16\n\nprocessor\t: 1\ncpu family\t: 99\n"
                    "model\t\t: 1\nmodel name\t: other\n")
    assert cpu_name(info) == "AMD EPYC (family 25, model 17)"
    info.write_text("processor\t: 0\nmodel name\t: ARMv8 Processor rev 1 (v8l)\nBogoMIPS\t: 50.00\n")
    assert cpu_name(info) == "ARMv8 Processor rev 1 (v8l)"  # no family or model lines: the name alone
    if shutil.which("lscpu") and Path("/proc/cpuinfo").exists():
        fields = dict(line.split(":", 1) for line in subprocess.run(["lscpu"], capture_output=True, text=True,
                                                                    env={"LC_ALL": "C"}).stdout.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if "CPU family" in fields and "Model" in fields:
            assert cpu_name() == f"{fields['Model name']} (family {fields['CPU family']}, model {fields['Model']})"


def test_checkpoint_metadata_describes_the_model_without_a_directory_name():
    cfg = C.to_dict(C.load_config("tiny-euclip"))
    meta = rundir.checkpoint_meta(cfg, "d2", 64)
    assert meta == {"arch": "tiny-vit-c16", "final_ln": False, "geometry": "euclidean", "logit": "d2",
                    "blocks": cfg["geometry"]["blocks"], "embed_dim": 64}


def test_inference_autocast_covers_the_encoders_only_and_keys_its_own_feature_cache(world, tmp_path):
    """What a GPU evaluation sets (``encoder_precision``), exercised with the CPU's bf16 autocast:
    the towers compute in bf16 (results move by bf16 rounding, not more), the geometry's output
    stays fp32, and the feature cache keeps these features apart from fp32 ones."""
    from euclip_cli.encode import feature_cache
    from euclip_cli.model import EuclipModel

    cfg = C.load_config("tiny-clip", [f"data.train_dir={world / 'train'}", "optim.samples=32", *TINY])
    loop.run(cfg, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    torch.manual_seed(0)
    model = EuclipModel(cfg).eval()
    images, tokens = torch.randn(4, 3, 64, 64), torch.randint(1, 400, (4, 20))
    with torch.no_grad():
        exact = model.encode_image(images), model.encode_text(tokens)
        fp32_cache = feature_cache(run, run.latest_checkpoint(), model)
        model.encoder_precision = "bf16"
        cast = model.encode_image(images), model.encode_text(tokens)
    for a, b in zip(exact, cast):
        assert b.dtype == torch.float32
        assert not torch.equal(a, b)
        assert (a - b).norm() / a.norm() < 0.05
    assert feature_cache(run, run.latest_checkpoint(), model).folder != fp32_cache.folder
