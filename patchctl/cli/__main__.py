"""`python -m patchctl.cli`: the same entry point as the `patchctl` script."""

# Before main.py is even read: a Ctrl-C while it loads exits 130 with nothing printed.
from patchctl.cli import interrupt

interrupt.install()

from patchctl.cli.main import main  # noqa: E402

main()
