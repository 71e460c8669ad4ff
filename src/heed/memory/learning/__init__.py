"""Background learning: facts extracted from what was retained, observations consolidated from them.

``extraction`` asks an LLM for the facts in a document's units; ``consolidation`` turns new facts
into observations in cancellable background runs; ``scopes`` decides which facts consolidate
together and with which mission.
"""
