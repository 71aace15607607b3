"""Capacity arithmetic: KV-cache sizing, safe batch ceilings, number coercions. Pure."""
