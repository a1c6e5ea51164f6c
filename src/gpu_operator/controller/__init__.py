"""The operator: kopf handlers and Kubernetes I/O around the pure decision modules."""
