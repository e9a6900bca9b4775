"""Layer 2: working memory — the hot/warm window over a session — and its background
consolidation into the other layers."""
