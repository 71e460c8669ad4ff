"""Pydantic models of heed's HTTP wire formats, one module per API family."""
