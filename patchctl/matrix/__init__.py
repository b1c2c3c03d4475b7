"""The compatibility matrix: every patch against every release (build), merged, diffed and rendered
as YAML, Markdown and a self-contained HTML page (html_page)."""
