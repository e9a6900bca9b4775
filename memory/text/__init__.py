"""Text as memory reads it: the tokeniser and token estimate, similarity, credentials that
are never stored, third-party material."""
