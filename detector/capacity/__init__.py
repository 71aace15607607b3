"""Capacity arithmetic, pure: the model's shape from its config.json (``model_config``),
KV-cache sizing and safe batch ceilings (``sizing``, ``ceilings``), number coercions."""
