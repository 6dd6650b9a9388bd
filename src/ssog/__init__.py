"""SSoG."""
