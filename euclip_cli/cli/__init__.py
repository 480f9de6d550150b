"""The ``euclip`` command line (``main``), one module per command; ``common``: what every command shares."""
