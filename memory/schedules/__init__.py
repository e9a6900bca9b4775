"""The schedule store (reminders, scheduled messages) and when a recurring one is due."""
