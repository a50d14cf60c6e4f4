"""`make bench`: measurements, not tests.  Run with ``python -m bench``."""
