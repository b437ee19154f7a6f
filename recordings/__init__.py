"""Keep: the on-disk recording format, its reader, analysis, compare and export."""
