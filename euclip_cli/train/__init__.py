"""The one trainer: ``run(config, run_dir)``."""
