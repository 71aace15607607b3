"""Plain nginx: the rate limit and the admission rule (``client_max_body_size``) as the include
files it writes (config.py), and their actuators (limiter.py)."""
