"""The `qkv` command: every subcommand, one module per group."""
