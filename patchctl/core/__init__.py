"""Ground: errors, paths, the atomic writer, no-follow file access, configuration, engine facts
(engines.yaml), versions, the bounded YAML/JSON reader and the input schemas. Imports nothing above it."""
