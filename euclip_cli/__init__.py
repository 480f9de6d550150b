"""euclip: embedding geometries of contrastive language-image pre-training (the library; ``euclip_cli.cli`` is
its command line)."""


def __getattr__(name: str):
    # The version is read from the installed metadata when asked for: importlib.metadata costs about 17 ms,
    # which every command line would otherwise spend before its entry point can take SIGINT and SIGTERM.
    if name == "__version__":
        from importlib.metadata import version

        return version("euclip")
    raise AttributeError(f"module 'euclip_cli' has no attribute {name!r}")
