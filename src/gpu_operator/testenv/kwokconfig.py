"""What testenv hands kwok and the API server as configuration: kwok's KwokConfiguration with the
Stages that play the kubelets (node heartbeats, pod lifecycles, one simulated fault) and the
API server's audit policy.

Plain text, kept apart from the start-up procedure so that the stages can be read (and unit
tested) on their own; `startup` writes them into the state dir.
"""

from __future__ import annotations

# Every request at Metadata level, except the kubelets' (kwok's) node Lease renewals: one per
# node every 10 s, 13,000 a minute at 2,000 nodes, which no test reads. Writes to a Node
# itself (labels, taints, cordon; not its status) keep their body, so that a test that finds
# an unexpected one can say what it changed.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  namespaces: [kube-node-lease]
  resources: [{group: coordination.k8s.io, resources: [leases]}]
- level: Request
  verbs: [patch, update]
  resources: [{group: "", resources: [nodes]}]
- level: Metadata
"""
# The parallelism (default 4) bounds how fast hundreds of nodes and their pods turn Ready.
#
# The node stages are our own, because kwok 0.7 picks its default node stages backwards: given
# --node-lease-duration-seconds it renews the Leases *and* posts every node's status every
# 20-45 s (the stage meant for nodes without Leases), 1,700 node updates a minute at 500 nodes.
# A kubelet that renews a Lease posts its status only when it changes or every
# nodeStatusReportFrequency (5 min), so the heartbeat stage below does the same. The pod
# stages are kwok's defaults plus one simulated fault (see _POD_STAGES).
_NODE_STATUS = """\
      {{ $now := Now }}
      {{ $since := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - type: {{ .type | Quote }}
        status: {{ .status | Quote }}
        reason: {{ .reason | Quote }}
        message: {{ .message | Quote }}
        lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $since | Quote }}
      {{ end }}
      addresses:
      {{ with .status.addresses }}
      {{ YAML . 1 }}
      {{ else }}
      - type: InternalIP
        address: {{ NodeIP | Quote }}
      - type: Hostname
        address: {{ NodeName | Quote }}
      {{ end }}
      {{ with NodePort }}
      daemonEndpoints:
        kubeletEndpoint:
          Port: {{ . }}
      {{ end }}
"""
# What the node's creator set (GPU nodes carry nvidia.com/gpu), else room for any pod.
_NODE_RESOURCES = """\
      {field}:
      {{{{ with .status.{field} }}}}
      {{{{ YAML . 1 }}}}
      {{{{ else }}}}
        cpu: 1k
        memory: 1Ti
        pods: 1M
      {{{{ end }}}}
"""
# A pod with this env var set to NOT_READY in any of its containers (init containers included)
# starts as any other on a kwok node (phase Running, a pod IP, containers running) but never
# turns Ready: its Ready and ContainersReady conditions stay False (reason SimulatedFault), as
# a driver container whose readiness probe (validation) never passes. Deleting it works as
# for any pod. Canary driver upgrades use it to fail the canary.
SIMULATED_FAULT_ENV = "GPU_OPERATOR_SIMULATE_FAULT"
NOT_READY = "not-ready"
SIMULATED_FAULT_REASON = "SimulatedFault"
# The values of SIMULATED_FAULT_ENV in a pod's containers (kwok's jq, gojq).
_FAULT_QUERY = (
    "(.spec.initContainers // []) + .spec.containers | .[] | .env // [] | .[]"
    f' | select(.name == "{SIMULATED_FAULT_ENV}") | .value'
)

# kwok v0.7's default pod stages (sigs.k8s.io/kwok@v0.7.0 kustomize/stage/pod/fast: pod-ready,
# pod-complete, pod-delete), copied as they are: a kind with any Stage in the configuration
# gets only those, not kwok's defaults. The one change is pod-ready's last selector expression,
# which leaves the faulted pods to testenv-pod-not-ready (two stages that both match a pod
# would be picked between at random).
_POD_READY_CONDITIONS = """\
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: ContainersReady
"""
_POD_READY_CONTAINERS = """\
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
"""
# The faulted pod's: started but not ready, as the kubelet reports a failing readiness probe.
_POD_NOT_READY_CONDITIONS = f"""\
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        type: Ready
        reason: {SIMULATED_FAULT_REASON}
        message: "{SIMULATED_FAULT_ENV}={NOT_READY}: containers never become ready"
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "False"
        type: ContainersReady
        reason: {SIMULATED_FAULT_REASON}
        message: "{SIMULATED_FAULT_ENV}={NOT_READY}: containers never become ready"
"""
_POD_NOT_READY_CONTAINERS = """\
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        started: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
"""
_POD_IP = (
    'PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" )'
    ' ( or .metadata.name "" ) ( or .metadata.namespace "" )'
)


def _pod_started(conditions: str, containers: str) -> str:
    """kwok's pod-ready statusTemplate, with the Ready conditions and container statuses given."""
    return (
        """\
      {{ $now := Now }}

      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
"""
        + conditions
        + """\
      {{ range .spec.readinessGates }}
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: {{ .conditionType | Quote }}
      {{ end }}

"""
        + containers
        + """
      initContainerStatuses:
      {{ range .spec.initContainers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        {{ if eq .restartPolicy "Always" }}
        started: true
        state:
          running:
            startedAt: {{ $now | Quote }}
        {{ else }}
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
        {{ end }}
      {{ end }}

      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ """
        + _POD_IP
        + """ | Quote }}
      phase: Running
      startTime: {{ $now | Quote }}
"""
    )


_POD_STARTING = """\
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.podIP'
      operator: 'DoesNotExist'
"""
_POD_STAGES = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
{_POD_STARTING}\
    - key: '{_FAULT_QUERY}'
      operator: 'NotIn'
      values:
      - '{NOT_READY}'
  next:
    statusTemplate: |
{_pod_started(_POD_READY_CONDITIONS, _POD_READY_CONTAINERS)}\
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: testenv-pod-not-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
{_POD_STARTING}\
    - key: '{_FAULT_QUERY}'
      operator: 'In'
      values:
      - '{NOT_READY}'
  next:
    statusTemplate: |
{_pod_started(_POD_NOT_READY_CONDITIONS, _POD_NOT_READY_CONTAINERS)}\
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values:
      - 'Job'
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $root := . }}}}
      containerStatuses:
      {{{{ range $index, $item := .spec.containers }}}}
      {{{{ $origin := index $root.status.containerStatuses $index }}}}
      - image: {{{{ $item.image | Quote }}}}
        name: {{{{ $item.name | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{{{ $now | Quote }}}}
            reason: Completed
            startedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      phase: Succeeded
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  next:
    finalizers:
      empty: true
    delete: true
"""
KWOK_CONFIG = f"""\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  nodePlayStageParallelism: 16
  podPlayStageParallelism: 16
  nodeLeaseParallelism: 16
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: testenv-node-ready
spec:
  resourceRef: {{apiGroup: v1, kind: Node}}
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ['True']
  next:
    statusTemplate: |
{_NODE_STATUS}\
      {{{{ $info := .status.nodeInfo }}}}
      {{{{ $kwok := printf "kwok-%s" Version }}}}
      nodeInfo:
        architecture: {{{{ or $info.architecture "amd64" }}}}
        operatingSystem: {{{{ or $info.operatingSystem "linux" }}}}
        kubeletVersion: {{{{ or $info.kubeletVersion $kwok }}}}
        containerRuntimeVersion: {{{{ or $info.containerRuntimeVersion $kwok }}}}
        kernelVersion: {{{{ or $info.kernelVersion $kwok }}}}
        kubeProxyVersion: {{{{ or $info.kubeProxyVersion $kwok }}}}
        osImage: {{{{ or $info.osImage `""` }}}}
        machineID: {{{{ or $info.machineID `""` }}}}
        systemUUID: {{{{ or $info.systemUUID `""` }}}}
        bootID: {{{{ or $info.bootID `""` }}}}
{_NODE_RESOURCES.format(field="allocatable")}\
{_NODE_RESOURCES.format(field="capacity")}\
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: testenv-node-status-report
spec:
  resourceRef: {{apiGroup: v1, kind: Node}}
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: In
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: In
      values: ['True']
  delay:
    durationMilliseconds: 300000
    jitterDurationMilliseconds: 330000
  next:
    statusTemplate: |
{_NODE_STATUS}---
{_POD_STAGES}"""
