"""The apply engine: parse variant files into hunks, evaluate a series against pristine upstream files
(outcome per patch, the patched bytes), and relocate hunks whose code moved to another file."""
