"""`python -m qkv` is the `qkv` command."""

from .cli.app import main

main()
