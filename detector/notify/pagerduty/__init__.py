"""PagerDuty: the incident's page through the Events API v2, from the outbox."""
