"""The system of record of incidents: the ORM models, the writes (``service``, ``flows``:
decisions to rows and timeline entries), the questions each incident answers (``questions``),
its lifecycle as people set it (``lifecycle``), the alerts joined to it (``alerts``) and the
API schemas (``schemas``)."""
