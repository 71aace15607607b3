"""Records in, signals out: the formats the detector reads and what each line means.

``detect`` recognizes a record's format and calls the parser of ``sources`` (one module per
format, each with its source); ``container_log``, ``engine_lines``, ``classify`` and
``crash_causes`` read what a container's log line says (a GPU OOM, an engine's startup numbers,
a crash's cause); ``reader`` and ``multiline`` read files; ``model`` holds ``Signal`` and its
kinds. Pure apart from reading files."""
