"""Offline tools: ``replay`` (a trace through the live plan loop, no upstream), ``plot`` (its chart),
``settings_doc`` (the settings table of the README)."""
