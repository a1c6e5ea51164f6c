"""Everything an install needs: the operator's RBAC, the deploy/ manifests and the OLM bundle,
generated from one source so `kubectl apply -f deploy/` and OLM never disagree."""
