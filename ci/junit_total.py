"""Sums JUnit XML reports (pytest's --junitxml) into one closing line, "N passed, N failed, N skipped",
for .ci/run, whose test suite runs as two pytest processes at once."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def totals(paths: list[str]) -> dict[str, int]:
    """tests, failures, errors and skipped over every report; `unread`: reports that could not be read
    (a stream that died before writing one), each counted as a failure."""
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "unread": 0}
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as exc:
            print(f"junit_total: cannot read {path}: {exc}", file=sys.stderr)
            counts["unread"] += 1
            continue
        for suite in root.iter("testsuite"):
            for key in ("tests", "failures", "errors", "skipped"):
                counts[key] += int(suite.get(key, 0))
    return counts


def main(argv: list[str]) -> int:
    c = totals(argv)
    passed = c["tests"] - c["failures"] - c["errors"] - c["skipped"]
    failed = c["failures"] + c["errors"] + c["unread"]
    print(f"{passed} passed, {failed} failed, {c['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
