"""memsnap.torch -- plug memsnap into torch (to be written)."""
