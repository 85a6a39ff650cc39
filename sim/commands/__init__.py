"""Subcommands of the `servesim` CLI; each module offers `add_parser(subparsers)`."""
