{{/* Labels Helm users expect on every object of a release (never on selectors). */}}
{{- define "gpu-operator.labels" -}}
{{- dict "helm.sh/chart" (printf "%s-%s" .Chart.Name .Chart.Version) "app.kubernetes.io/instance" .Release.Name "app.kubernetes.io/managed-by" .Release.Service | toJson -}}
{{- end -}}

{{/* The operator image: operator.repository/image:version, the project's image in place of
NVIDIA's operator image (which cannot run this operator), version default appVersion. */}}
{{- define "gpu-operator.image" -}}
{{- $o := .Values.operator -}}
{{- $repository := $o.repository | default "[[DEFAULT_REPOSITORY]]" -}}
{{- $image := $o.image | default "[[DEFAULT_IMAGE]]" -}}
{{- $version := toString ($o.version | default .Chart.AppVersion) -}}
{{- if has (printf "%s/%s" $repository $image) (fromJsonArray [[NVIDIA_IMAGES]]) -}}
{{- $repository = "[[DEFAULT_REPOSITORY]]" -}}{{- $image = "[[DEFAULT_IMAGE]]" -}}{{- $version = .Chart.AppVersion -}}
{{- end -}}
{{- $path := $image -}}
{{- if $repository }}{{ $path = printf "%s/%s" (trimSuffix "/" $repository) $image }}{{ end -}}
{{- if contains ":" $version }}{{ printf "%s@%s" $path $version }}{{ else }}{{ printf "%s:%s" $path $version }}{{ end -}}
{{- end -}}

{{/* "true" when a value is set: not null, "", [] or {} (NVIDIA's values' "not set"). */}}
{{- define "gpu-operator.isSet" -}}
{{- if kindIs "invalid" . -}}
{{- else if and (kindIs "string" .) (eq . "") -}}
{{- else if and (or (kindIs "slice" .) (kindIs "map" .)) (empty .) -}}
{{- else -}}true{{- end -}}
{{- end -}}

{{/* (list VALUE KEY) -> {"v": VALUE without unset map entries} or {} when nothing is left;
a number under a key named "version" becomes a string. */}}
{{- define "gpu-operator.prune" -}}
{{- $value := index . 0 -}}
{{- $key := index . 1 -}}
{{- if kindIs "map" $value -}}
{{- $out := dict -}}
{{- range $k, $v := $value -}}
{{- $pruned := include "gpu-operator.prune" (list $v $k) | fromJson -}}
{{- if hasKey $pruned "v" }}{{ $_ := set $out $k $pruned.v }}{{ end -}}
{{- end -}}
{{- if $out }}{{ dict "v" $out | toJson }}{{ else }}{}{{ end -}}
{{- else if include "gpu-operator.isSet" $value -}}
{{- if and (has $key (fromJsonArray [[STRING_KEYS]])) (not (kindIs "string" $value)) -}}
{{- dict "v" (toString $value) | toJson -}}
{{- else -}}
{{- dict "v" $value | toJson -}}
{{- end -}}
{{- else -}}{}{{- end -}}
{{- end -}}

{{/* (list MAP "a.b.c") -> {"v": the value at that path} or {} when there is none. */}}
{{- define "gpu-operator.lookup" -}}
{{- $node := index . 0 -}}
{{- $found := true -}}
{{- range splitList "." (index . 1) -}}
{{- if and $found (kindIs "map" $node) (hasKey $node .) }}{{ $node = index $node . }}{{ else }}{{ $found = false }}{{ end -}}
{{- end -}}
{{- if $found }}{{ dict "v" $node | toJson }}{{ else }}{}{{ end -}}
{{- end -}}

{{/* (list MAP "from.path" "to.path") moves a value inside MAP; an empty "to" drops it. */}}
{{- define "gpu-operator.move" -}}
{{- $root := index . 0 -}}
{{- $from := splitList "." (index . 1) -}}
{{- $parent := $root -}}
{{- range initial $from -}}
{{- if and (kindIs "map" $parent) (hasKey $parent .) }}{{ $parent = index $parent . }}{{ else }}{{ $parent = dict }}{{ end -}}
{{- end -}}
{{- if and (kindIs "map" $parent) (hasKey $parent (last $from)) -}}
{{- $value := index $parent (last $from) -}}
{{- $_ := unset $parent (last $from) -}}
{{- if index . 2 -}}
{{- $to := splitList "." (index . 2) -}}
{{- $node := $root -}}
{{- range initial $to -}}
{{- if not (kindIs "map" (get $node .)) }}{{ $_ := set $node . dict }}{{ end -}}
{{- $node = get $node . -}}
{{- end -}}
{{- $_ := set $node (last $to) $value -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* (list MAP "a.b.c") makes the value at that path a string, if there is one. */}}
{{- define "gpu-operator.stringify" -}}
{{- $path := splitList "." (index . 1) -}}
{{- $parent := index . 0 -}}
{{- range initial $path -}}
{{- if and (kindIs "map" $parent) (hasKey $parent .) }}{{ $parent = index $parent . }}{{ else }}{{ $parent = dict }}{{ end -}}
{{- end -}}
{{- if and (kindIs "map" $parent) (hasKey $parent (last $path)) -}}
{{- $_ := set $parent (last $path) (toString (index $parent (last $path))) -}}
{{- end -}}
{{- end -}}

{{/* (list POD_SPEC .Values.operator): pull policy and secrets, tolerations (after the pod's own), node selector. */}}
{{- define "gpu-operator.podValues" -}}
{{- $pod := index . 0 -}}
{{- $o := index . 1 -}}
{{- range $pod.containers -}}
{{- if $o.imagePullPolicy }}{{ $_ := set . "imagePullPolicy" $o.imagePullPolicy }}{{ end -}}
{{- end -}}
{{- if $o.imagePullSecrets -}}
{{- $secrets := list -}}
{{- range $o.imagePullSecrets }}{{ $secrets = append $secrets (dict "name" .) }}{{ end -}}
{{- $_ := set $pod "imagePullSecrets" $secrets -}}
{{- end -}}
{{- if $o.tolerations }}{{ $_ := set $pod "tolerations" (concat ($pod.tolerations | default list) $o.tolerations) }}{{ end -}}
{{- range $key, $value := $o.nodeSelector }}{{ $_ := set $pod.nodeSelector $key $value }}{{ end -}}
{{- end -}}

{{/* (list OBJECT ROOT) adds the release labels to OBJECT's metadata. */}}
{{- define "gpu-operator.release" -}}
{{- $meta := (index . 0).metadata -}}
{{- $_ := set $meta "labels" (merge (dict) ($meta.labels | default dict) (include "gpu-operator.labels" (index . 1) | fromJson)) -}}
{{- end -}}

{{/* A JSON array of objects with the namespace and image placeholders filled in. */}}
{{- define "gpu-operator.objects" -}}
{{- $text := index . 0 -}}
{{- $root := index . 1 -}}
{{- $text = $text | replace (printf "%q" "[[NAMESPACE]]") ($root.Release.Namespace | toJson) -}}
{{- $text | replace (printf "%q" "[[IMAGE]]") (include "gpu-operator.image" $root | toJson) -}}
{{- end -}}
