"""``python -m euclip_cli``: the same CLI as ``euclip`` (and what ``torchrun -m euclip_cli`` runs)."""

from euclip_cli.cli import main

main()
