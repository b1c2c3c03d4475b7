"""A tree patchctl writes to (an installed engine or a directory): finding it, applying and reverting the
series all or nothing, and the on-disk state (record, lock, journal) that makes that safe."""
