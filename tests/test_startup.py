"""A command's imports (euclip_cli/startup.py): the command line hides transformers and wandb from open_clip's
first import only; a library user's imports are untouched; a Hugging Face text tower is still built. Each
case in a fresh interpreter, since what it checks is what a process imports first."""

import os
import subprocess
import sys
import textwrap


def fresh(code: str) -> subprocess.CompletedProcess:
    # Offline: the registered Hugging Face model's config is then missing at once, not after a network timeout.
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))


def test_the_command_line_imports_open_clip_without_transformers_and_wandb_and_can_still_build_a_hf_text_tower():
    done = fresh("""
        import sys
        from euclip_cli.cli import common  # what run_app calls first, before any command imports open_clip
        common.hide_unused_from_open_clip()
        import open_clip
        assert "transformers" not in sys.modules and "wandb" not in sys.modules, "imported with open_clip"
        assert open_clip.hf_model.transformers is None
        assert not any(type(f).__name__ == "_OpenClipWithoutUnused" for f in sys.meta_path), "the finder stayed"
        import wandb  # hidden from open_clip's import only: importable afterwards (train.wandb imports it)

        # A registered Hugging Face model reaches transformers (offline here: its config is not cached), not
        # open_clip's "pip install transformers", which it says when the import it ran found none.
        from euclip_cli.towers.archs import open_clip_model
        try:
            open_clip_model("roberta-ViT-B-32")
        except OSError:  # transformers' "couldn't connect to 'https://huggingface.co'"
            pass
        import torch, transformers
        config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32, max_position_embeddings=16)
        # open_clip.model's own reference to the class, as its _build_text_tower uses it
        tower = open_clip.model.HFTextEncoder("bert-base-uncased", output_dim=8, config=config, pretrained=False,
                                              pooler_type="mean_pooler", proj_type="linear")
        assert tower(torch.randint(1, 50, (3, 7))).shape == (3, 8)
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_importing_euclip_as_a_library_leaves_open_clips_imports_as_they_are():
    done = fresh("""
        import sys
        import euclip_cli.towers.archs, open_clip
        assert "transformers" in sys.modules and open_clip.hf_model.transformers is not None
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
