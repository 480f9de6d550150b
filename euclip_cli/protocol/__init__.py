"""The evaluation protocol, read by every runner: the task registry and its suites (``tasks``), how a
suite's results aggregate into its groups and average (``aggregate``), and the format of an eval line's
per-example outcomes (``hits``). Torch-free."""
