"""A patch's own checks: pristine and patched trees of a release, the environments they run in, the
pytest runner and the fixture plugin loaded into it."""
