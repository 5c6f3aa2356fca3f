"""Int8 against float32, through this engine."""
