"""Writing with a model: the decoding loops, sampling, chat and the next-token distribution."""
