"""``sdg doctor``: facts (names and results), collect (I/O), judge (pure), render,
the command, and ``--probe``."""
