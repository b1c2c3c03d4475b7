"""Container images as a place the engine lives: read an image's layers from an OCI / Docker registry
or an OCI layout directory, find the engine's installed tree in them, and write the patched files
back as one new layer (no container daemon).

One module per idea: `reference` (what `REGISTRY/REPO:TAG` or `oci:DIR:TAG` means), `auth` (the
standard credential files), `registry` and `layout` (the two places images are read from and pushed
to, behind one interface), `manifest` (media types, platforms, the new config and manifest),
`layers` (streaming tar layers, whiteouts, the engine's tree), `newlayer` (the tar layer patchctl
writes), `stack` and `stream` (bounded, digest-checked reads). This folder reads and writes images
only: patching one is the work layer's (patchctl/tree/image.py), its flags the command line's
(patchctl/cli/image_options.py, image_command.py).
"""
