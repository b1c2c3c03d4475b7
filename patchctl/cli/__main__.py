"""`python -m patchctl.cli`: the same entry point as the `patchctl` script."""

from patchctl.cli.main import main

main()
