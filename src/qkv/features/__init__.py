"""Features, not just heads: a model's activations stored at scale (`activations`) and sparse
autoencoders that decompose them into sparse, mostly interpretable features (README, "Features:
sparse autoencoders")."""
