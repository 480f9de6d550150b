"""``python -m euclip_cli``: the same CLI as ``euclip`` (and what ``torchrun -m euclip_cli`` runs)."""

from euclip_cli.cli.entry import euclip

if __name__ == "__main__":  # img2dataset's spawned workers re-import this module
    euclip()
