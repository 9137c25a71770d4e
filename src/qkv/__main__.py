"""`python -m qkv` is the `qkv` command."""

from .cli import main

main()
