"""Local runs whose master lives in a process of its own, owned by the launching one.

``orch.launch(..., apart=True)``, and every launch from a notebook kernel.
"""
