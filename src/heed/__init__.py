"""heed."""
