"""The postmortem export: analysis (pandas), plots (matplotlib), rendering (Jinja2)."""
