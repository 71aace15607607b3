"""Notifications: the outbox of what people are told, and the Slack face that tells them."""
