"""The app's start-up and shutdown as an ordered table of named steps: the table
(``steps.py``), the runner (``lifespan.py``) and the steps themselves, one module per area
(``memory.py``, ``models.py``, ``agent.py``, ``delivery.py``, ``messages.py``, ``web.py``).
``bot/app.py`` (the composition root) runs the table; nothing here imports it."""
