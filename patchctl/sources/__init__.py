"""Where pristine upstream files come from: a package index (sparse wheel reads or whole
artifacts), an installed environment, a git repository, or a directory."""
