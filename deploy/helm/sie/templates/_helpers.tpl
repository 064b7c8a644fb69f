{{/* Names */}}
{{- define "sie.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sie.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sie.labels" -}}
app.kubernetes.io/name: {{ include "sie.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "sie.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sie.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sie.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}

{{- define "sie.secretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "sie.fullname" .)) -}}
{{- end -}}

{{- define "sie.natsUrl" -}}
{{- if .Values.nats.enabled -}}
{{- printf "nats://%s-nats:4222" (include "sie.fullname" .) -}}
{{- else -}}
{{- required "nats.external.url is required when nats.enabled is false" .Values.nats.external.url -}}
{{- end -}}
{{- end -}}

{{- define "sie.configServiceUrl" -}}
{{- printf "http://%s-config:%v" (include "sie.fullname" .) .Values.config.port -}}
{{- end -}}

{{/*
One lane token (architecture §16.3): trimmed, validated against ^[A-Za-z0-9_-]+$ and at
most 63 characters, then lowercased. An explicit blank fails the render.
Args: list lane-name field raw-value
*/}}
{{- define "sie.laneToken" -}}
{{- $lane := index . 0 -}}{{- $field := index . 1 -}}
{{- $raw := trim (toString (index . 2)) -}}
{{- if eq $raw "" -}}
{{- fail (printf "worker lane %q: %s is blank" $lane $field) -}}
{{- end -}}
{{- if not (regexMatch "^[A-Za-z0-9_-]+$" $raw) -}}
{{- fail (printf "worker lane %q: %s %q must match ^[A-Za-z0-9_-]+$" $lane $field $raw) -}}
{{- end -}}
{{- if gt (len $raw) 63 -}}
{{- fail (printf "worker lane %q: %s %q is longer than 63 characters" $lane $field $raw) -}}
{{- end -}}
{{- lower $raw -}}
{{- end -}}

{{/*
The canonical worker lanes as a JSON list: each {name, pool, machineProfile, bundle,
lane, autoscaled, spec}. Fails the render on a bad name or token, a tuple collision, a
duplicate name, or a non-default pool missing from queueRouting.staticQueuePools.
*/}}
{{- define "sie.lanes" -}}
{{- $out := list -}}
{{- $seen := dict -}}
{{- $names := dict -}}
{{- $static := list -}}
{{- range .Values.queueRouting.staticQueuePools -}}
{{- $static = append $static (include "sie.laneToken" (list "queueRouting.staticQueuePools" "pool" .)) -}}
{{- end -}}
{{- range $i, $l := .Values.workers.lanes -}}
{{- $label := printf "#%d" $i -}}
{{- if hasKey $l "name" -}}{{- $label = toString $l.name -}}{{- end -}}
{{- $pool := include "sie.laneToken" (list $label "pool" (ternary $l.pool "default" (hasKey $l "pool"))) -}}
{{- $profile := include "sie.laneToken" (list $label "machineProfile" (ternary $l.machineProfile "default" (hasKey $l "machineProfile"))) -}}
{{- $bundle := include "sie.laneToken" (list $label "bundle" (ternary $l.bundle "default" (hasKey $l "bundle"))) -}}
{{- $name := lower (trim (toString ($l.name | default (printf "%s-%s-%s" $pool $profile $bundle | replace "_" "-")))) -}}
{{- if or (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $name)) (gt (len $name) 30) -}}
{{- fail (printf "worker lane %q: name must be a DNS-1123 label of at most 30 characters" $name) -}}
{{- end -}}
{{- if hasKey $names $name -}}
{{- fail (printf "worker lane %q: the name is used twice" $name) -}}
{{- end -}}
{{- $_ := set $names $name true -}}
{{- $tuple := printf "%s/%s/%s" $pool $profile $bundle -}}
{{- if hasKey $seen $tuple -}}
{{- fail (printf "worker lane %q: lane %s collides with lane %q (tokens are trimmed and lowercased)" $name $tuple (get $seen $tuple)) -}}
{{- end -}}
{{- $_ := set $seen $tuple $name -}}
{{- if and (ne $pool "default") (not (has $pool $static)) -}}
{{- fail (printf "worker lane %q: pool %q must be listed in queueRouting.staticQueuePools" $name $pool) -}}
{{- end -}}
{{- $autoscaled := and $.Values.keda.enabled (hasKey $l "maxReplicas") -}}
{{- if and (not $autoscaled) (not (hasKey $l "replicas")) -}}
{{- fail (printf "worker lane %q: set replicas, or maxReplicas with keda.enabled" $name) -}}
{{- end -}}
{{- $out = append $out (dict "name" $name "pool" $pool "machineProfile" $profile "bundle" $bundle "lane" $tuple "autoscaled" $autoscaled "spec" $l) -}}
{{- end -}}
{{- if gt (len $out) 1024 -}}
{{- fail "workers.lanes: at most 1024 lanes (SIE_GATEWAY_CONFIGURED_PHYSICAL_LANES)" -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{- define "sie.staticQueuePools" -}}
{{- $static := list -}}
{{- range .Values.queueRouting.staticQueuePools -}}
{{- $static = append $static (include "sie.laneToken" (list "queueRouting.staticQueuePools" "pool" .)) -}}
{{- end -}}
{{- join "," (uniq $static) -}}
{{- end -}}

{{/* Env every SIE process gets: bus, listen address, auth from the Secret. */}}
{{- define "sie.commonEnv" -}}
- name: SIE_BUS
  value: nats
- name: SIE_NATS_URL
  value: {{ include "sie.natsUrl" . | quote }}
- name: SIE_HOST
  value: "0.0.0.0"
- name: SIE_AUTH_MODE
  value: token
- name: SIE_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "sie.secretName" . }}
      key: auth-token
- name: SIE_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "sie.secretName" . }}
      key: admin-token
{{- if .Values.auth.exemptOperational }}
- name: SIE_AUTH_EXEMPT_OPERATIONAL
  value: "true"
{{- end }}
{{- with .Values.commonEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Env gateways AND workers get from one value each, so the two stream creators and the
lane catalog cannot disagree (architecture §8.2, §16.3).
*/}}
{{- define "sie.routingEnv" -}}
{{- $lanes := include "sie.lanes" . | fromJsonArray -}}
{{- $profiles := list -}}{{- $tuples := list -}}
{{- range $lanes -}}
{{- $profiles = append $profiles .machineProfile -}}
{{- $tuples = append $tuples .lane -}}
{{- end -}}
{{- $replicas := int .Values.queueRouting.streamReplicas -}}
{{- $natsSize := ternary (int .Values.nats.replicas) (int .Values.nats.external.clusterSize) .Values.nats.enabled -}}
{{- if gt $replicas $natsSize -}}
{{- fail (printf "queueRouting.streamReplicas (%d) is more than the NATS cluster size (%d)" $replicas $natsSize) -}}
{{- end -}}
- name: SIE_CONFIG_SERVICE_URL
  value: {{ include "sie.configServiceUrl" . | quote }}
- name: SIE_STREAM_STORAGE
  value: {{ .Values.queueRouting.streamStorage | quote }}
- name: SIE_STREAM_REPLICAS
  value: {{ $replicas | quote }}
- name: SIE_STREAM_MAX_AGE_S
  value: {{ .Values.queueRouting.streamMaxAgeS | quote }}
{{- if $lanes }}
- name: SIE_GATEWAY_CONFIGURED_GPUS
  value: {{ join "," (uniq $profiles) | quote }}
- name: SIE_GATEWAY_CONFIGURED_PHYSICAL_LANES
  value: {{ join "," $tuples | quote }}
{{- end }}
{{- with (include "sie.staticQueuePools" .) }}
- name: SIE_GATEWAY_STATIC_QUEUE_POOLS
  value: {{ . | quote }}
{{- end }}
{{- if .Values.queueRouting.gpuAliases }}
{{- $pairs := list -}}
{{- range $alias, $target := .Values.queueRouting.gpuAliases }}
{{- $t := include "sie.laneToken" (list "queueRouting.gpuAliases" "machineProfile" $target) -}}
{{- if not (has $t $profiles) -}}
{{- fail (printf "queueRouting.gpuAliases: %q names machine profile %q, which no worker lane has" $alias $t) -}}
{{- end -}}
{{- $pairs = append $pairs (printf "%s=%s" (include "sie.laneToken" (list "queueRouting.gpuAliases" "alias" $alias)) $t) -}}
{{- end }}
- name: SIE_GATEWAY_GPU_ALIASES
  value: {{ join "," $pairs | quote }}
{{- end }}
- name: SIE_POOL_STORE
  value: {{ .Values.poolStore | quote }}
{{- if .Values.payloadStore.url }}
- name: SIE_PAYLOAD_STORE_URL
  value: {{ .Values.payloadStore.url | quote }}
{{- end }}
{{- end -}}

{{- define "sie.tmpVolume" -}}
- name: tmp
  emptyDir: {}
- name: home
  emptyDir: {}
{{- end -}}

{{- define "sie.tmpMounts" -}}
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: /home/sie/.cache
{{- end -}}
