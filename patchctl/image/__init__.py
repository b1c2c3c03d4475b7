"""Container images as a place the engine lives: read an image's layers from an OCI / Docker registry
or an OCI layout directory, find the engine's installed tree in them, and write the patched files
back as one new layer (no container daemon).

One module per idea: `reference` (what `REGISTRY/REPO:TAG` or `oci:DIR:TAG` means), `auth` (the
standard credential files), `registry` and `layout` (the two places images are read from and pushed
to, behind one interface), `manifest` (media types, platforms, the new config and manifest),
`layers` (streaming tar layers, whiteouts, the engine's tree), `newlayer` (the tar layer patchctl
writes), `patch` (apply and status on an image: the tree patchctl patches is the one it read
out of the layers). `options` and `command` are the command line's part (click, documents).
"""
