"""The consolidated report: the layered model computed from every phase's tables, per regime,
and the seed study's claims beside ours."""
