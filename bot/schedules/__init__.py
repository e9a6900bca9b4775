"""Reminders: the product's rules, the scheduler that sends them when due, each user's time
zone, and the reminder tools the model calls. The store is memory/schedules/."""
