"""memsnap.memory -- torch.cuda.memory API over memsnap (to be written)."""
