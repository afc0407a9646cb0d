"""Tools outside the per-call path: the benchmark (bench) and the tile tuner (tune)."""
