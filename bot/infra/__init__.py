"""Infrastructure: the ``ethan`` command, settings, logging, metrics, the terminal chat."""
