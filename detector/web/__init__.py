"""The detector's HTTP surface: incident pages, the JSON API, approvals and Slack's
interactions, behind tokens, login sessions or a trusted proxy (``detector.web.auth``)."""
