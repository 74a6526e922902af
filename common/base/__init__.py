"""Bottom layer used by every other: the error type, entry-point guard, atomic file writes, subprocess helpers."""
