"""A pure, event-time, seeded simulator of an LLM serving endpoint, faithful to the engines.

``scenario`` reads the knobs (YAML, pydantic); ``engine`` is one engine's scheduler and speed
(vLLM V1, SGLang, a server without paged attention) and ``memory`` its GPU memory, each from
the engine's own code; ``pods`` the Kubernetes life of the replicas (probes, CrashLoopBackOff,
rolling updates, evictions); ``traffic`` the arrivals, clients that retry as the OpenAI SDK
does, the gateway limit and the load balancer; ``emit``/``emit_sglang`` write what each shows
in the real wire formats through ``detector.lab``; ``outcome`` counts what the clients felt;
``model.Endpoint`` steps them together and is what the loop drives. The closed loop around it
(the Kubernetes API stand-in, the nginx stand-in, the detector reading the records) is
``kube_api``, ``gateway``, ``cluster`` and ``loop``.
"""
