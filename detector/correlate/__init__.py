"""Correlation, pure: signals in, decisions out (no store, no actuators).

``correlator`` keeps each workload's state (``state``, ``windows``) and runs the cascade
pattern (``pattern``): first victim -> suspected, second in the window -> cascading, quiet ->
contained -> resolved. ``identity`` attributes signals to workloads, ``requests`` keeps the
request sizes served and held at each death, ``series`` the per-workload pressure and traffic
buckets, ``forecast`` the next-victim trend, ``coverage`` which signal kinds each workload
sends, ``unattributed`` what could not be attributed, ``context`` the incident view that
containment plans from."""
