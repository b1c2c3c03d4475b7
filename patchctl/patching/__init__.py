"""Patches in memory: variant files parsed into hunks (hunks), a series evaluated against pristine
upstream files into an outcome per patch and the patched bytes (evaluate), and hunks whose code moved
to another file found there (relocate), and a user's edits captured into a store's variant
(capture: new, diff, refresh)."""
