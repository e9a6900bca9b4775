"""The cold zone: durable facts about one user."""
