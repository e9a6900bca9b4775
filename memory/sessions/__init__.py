"""Layer 1: sessions — every conversation's stored history, its search, speaker labels, and
records of chat events."""
