"""Ranks on a Ray cluster: ``cluster=orch.Ray(...)`` (``pip install "orch[ray]"``)."""
