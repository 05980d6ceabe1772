"""The cli package's exception hierarchy."""


class CliError(Exception):
    """A command that cannot do what was asked; the message is shown as one line."""
