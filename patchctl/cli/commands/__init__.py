"""One module per command; each returns (document, exit code) and never prints."""
