"""The built-in offline model: a Messages API server (server.py), the rules it answers with (rules.py), and how it reads the request (prompt.py)."""
