"""incidents package."""
