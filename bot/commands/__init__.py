"""Slash and admin commands, answered without calling the model: one module per command family
(help, sessions, memory, modes, reminders, admin, and the /memory card's clicks), every command
listed in one table, ``registry.py`` (name, aliases, family, who may run it), that the
dispatcher (``dispatcher.py``) looks commands up in."""
