"""Download progress for people: a rich bar on stderr when it is a terminal, nothing otherwise.

rich is imported only when a bar is started on a terminal: `ensure` under systemd, `--json` runs and
runs that download nothing never import it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from patchctl.sources.files import NoProgress

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class RichProgress:
    def __init__(self) -> None:
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def start(self, label: str, total: int | None) -> None:
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), transient=True
        )
        self._progress.start()
        self._task = self._progress.add_task(label, total=total)

    def advance(self, amount: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, amount)

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def progress_for() -> RichProgress | NoProgress:
    # On stderr, so it never mixes into --json output on stdout.
    return RichProgress() if sys.stderr.isatty() else NoProgress()
