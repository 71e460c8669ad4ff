"""transfer."""
