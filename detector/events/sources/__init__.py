"""One parser per record format (Fluent Bit, Vector, CRI, Docker, ingress-nginx and other load
balancers, Kubernetes Events and Pods, dcgm-exporter and engine metrics, nvidia-smi, kubectl
output, raw text), each naming the format's source; ``detect`` picks among them."""
