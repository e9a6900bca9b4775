"""Slash and admin commands, answered without calling the model (the package's modules say
which commands each holds)."""
