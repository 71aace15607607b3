"""Containment: the runbook (``definition``, ``loader``), the mechanism a cascade is dying of
(``mechanism``), the plan sized from the evidence (``planner``, ``rate_limits``), the step
machine (``transitions``, ``runner``, ``steps``) with its approvals, controls and rails, the
one decide flow every face acts through (``flows``), and the bindings from steps to actuators
(``bindings``)."""
