"""Layer 3: the user profile (one Markdown document per user) and the user's mode."""
