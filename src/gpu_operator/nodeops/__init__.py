"""What every planner that empties or cordons nodes shares (pure): the node and pod operations
it asks for, the pod view it reads and the drain that decides which pods go and how.

Below the driver upgrade and the GPU health remediation, so both speak one vocabulary and the
controller translates it into API actions in one place."""
