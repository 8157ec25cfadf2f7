"""Phase 0 — the environment: what we run on and the ceilings it reaches."""
