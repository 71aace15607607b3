"""The ``detector`` command line (Typer): one module per group of commands, all registered in
``main``; nothing else imports this package (``__main__`` runs it). Each command reads its
settings, calls the layer below (pipeline, stream, report, runbooks' decide flow, sim) and turns
its errors into one ``error:`` line and an exit status (``exits``)."""
