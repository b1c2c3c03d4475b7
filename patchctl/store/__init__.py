"""The patch store: the series, its metadata and variants, pins and the stores a record names."""
