"""What every reconcile loop runs on, knowing no loop: pass scheduling, the executor of API
actions, watches and the informer, leadership, liveness, health, metrics, configuration."""
