"""Phase 3 — the persistent kernel: the whole decode loop inside one launch.

- :mod:`.kernel`: launch configuration, variant resolution, launch and validation against eager.
- :mod:`.analysis`: the seed comparison and the clock summary (pandas, no torch).
- :mod:`.bench`, :mod:`.notebook`: the registered bench and notebook 03's parameters.
"""
