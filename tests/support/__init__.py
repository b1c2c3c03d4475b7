"""Builders for tests: real temporary git repos, trees, stores, wheels and a local package index."""
