"""Slack: the incident message (``blocks``), its delivery (``sender``), the buttons
(``interactions``) and the transports that bring the clicks (signed HTTP, Socket Mode)."""
