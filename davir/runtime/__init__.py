"""How a command runs: SIGTERM/Ctrl-C (`signals`), one writer per output (`locks`), what it cost (`cost`)."""
