"""The local web app (qkv serve)."""
