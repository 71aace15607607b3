"""What the demos, tests and benchmarks generate: the bundled recordings (``recording`` and its
crash and look-alike variants), real-shaped OOM wordings, a local Kafka-protocol broker
(``broker``), the live demo and the fuzzer. Never on the detector's record path."""
