"""Views: what a person looks at. The notebook panels (``panel``, ``sweep_panel``,
``comparison``), the terminal dashboard (``dashboard``) and the static record a saved
notebook keeps (``_static``). They read runs and sweeps; nothing below imports them.
"""
