"""A pure, event-time, seeded simulator of an LLM serving endpoint (issue 15).

``scenario`` reads the knobs (YAML, pydantic); ``engine`` is one vLLM replica's batching and GPU
memory; ``pods`` the Kubernetes life of the replicas (CrashLoopBackOff, rolling updates,
evictions); ``traffic`` the arrivals, clients with retries, the gateway limit and the load
balancer; ``emit`` writes what each of them shows in the real wire formats through
``detector.lab``; ``model.Endpoint`` steps them together and is what the loop drives. The
closed loop around it (the Kubernetes API stand-in, the detector reading the records) is
``kube_api``, ``cluster`` and ``loop``.
"""
