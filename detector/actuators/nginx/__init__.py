"""Plain nginx rate limit: the include files it writes (config.py) and the actuator (limiter.py)."""
