"""Carrying the series to new upstream versions: replay and classify (replay), record and reuse
people's conflict resolutions (rerere), and find the first release or commit that breaks a patch (bisect)."""
