"""The built-in offline model: a Messages API server (server.py) and the rules it answers with."""
