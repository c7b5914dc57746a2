"""What the tests share: the scripted runtime, real servers on loopback, injected faults,
GGUF fixtures, invariants and helpers. Imported as ``support.<module>`` (tests/ is on
``sys.path`` under pytest; scripts and benches put it there)."""
