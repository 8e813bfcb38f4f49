"""The lecture's model: attention and its cores, positions, layers, the three architectures, generation and
search, heads, and the LSTM baseline. Imports nothing from the rest of kqv (tests/test_layout.py)."""
