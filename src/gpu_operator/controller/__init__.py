"""The operator: watches and Kubernetes I/O around the pure decision modules."""
