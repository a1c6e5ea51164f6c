"""The kubelet's gRPC APIs as generated Python code (do not edit the generated modules).

Made by ``hack/gen-kubelet-protos.sh`` from the ``.proto`` files published in the
``k8s.io/kubelet`` Go module: ``deviceplugin.v1beta1`` (device plugins), ``podresources.v1``
(which pod holds which device), ``pluginregistration.v1`` (plugin sockets the kubelet
discovers) and ``dra.v1`` / ``dra.v1beta1`` (Dynamic Resource Allocation kubelet plugins).
A unit test regenerates them and fails on any drift.
"""

KUBELET_API_VERSION = "v0.34.4"
