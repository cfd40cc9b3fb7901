{{/* Name of the chart, or nameOverride. */}}
{{- define "dam.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects: "<release>-dam", or the release
name alone when it already contains the chart's name. */}}
{{- define "dam.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "dam.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dam.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels selecting the release's pods. */}}
{{- define "dam.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dam.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The ServiceAccount the pods run as. */}}
{{- define "dam.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dam.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: repository@digest when image.digest pins it,
repository:tag otherwise. */}}
{{- define "dam.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* Seconds in a Go duration ("30s", "1m30s", "500ms"), as a float;
fails naming the key when the text is not a duration. Called with
(list key text). */}}
{{- define "dam.seconds" -}}
{{- $key := index . 0 }}
{{- $text := toString (index . 1) }}
{{- if not (regexMatch "^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$" $text) }}
{{- fail (printf "%s: invalid duration %q: want a Go duration such as \"30s\"" $key $text) }}
{{- end }}
{{- $units := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 }}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9.]+[^0-9.]+" $text -1 }}
{{- $n := regexFind "^[0-9.]+" . | float64 }}
{{- $total = addf $total (mulf $n (get $units (regexReplaceAll "^[0-9.]+" . ""))) }}
{{- end }}
{{- $total }}
{{- end }}

{{/* Bytes in a Kubernetes memory quantity ("512Mi", "1G", "536870912"),
as a float; fails naming the key otherwise. Called with (list key text). */}}
{{- define "dam.bytes" -}}
{{- $key := index . 0 }}
{{- $text := toString (index . 1) }}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$" $text) }}
{{- fail (printf "%s: memory quantity %q: want a number with an optional suffix such as Mi or G" $key $text) }}
{{- end }}
{{- $units := dict "" 1.0 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 "k" 1000.0 "M" 1000000.0 "G" 1000000000.0 "T" 1000000000000.0 "P" 1000000000000000.0 "E" 1000000000000000000.0 }}
{{- mulf (regexFind "^[0-9.]+" $text | float64) (get $units (regexReplaceAll "^[0-9.]+" $text "")) }}
{{- end }}

{{/* The pod's terminationGracePeriodSeconds: the value, or shutdown_grace
plus 15 s; fails when it does not exceed shutdown_grace. */}}
{{- define "dam.terminationGracePeriodSeconds" -}}
{{- $grace := include "dam.seconds" (list "config.pipeline.shutdown_grace" .Values.config.pipeline.shutdown_grace) | float64 }}
{{- $period := int64 .Values.terminationGracePeriodSeconds }}
{{- if eq $period 0 }}
{{- $period = add (ceil $grace | int64) 15 }}
{{- end }}
{{- if le (float64 $period) $grace }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed config.pipeline.shutdown_grace (%s): Kubernetes would kill dam while it finishes its batches" $period (toString .Values.config.pipeline.shutdown_grace)) }}
{{- end }}
{{- $period }}
{{- end }}

{{/* GOMEMLIMIT in bytes from resources.limits.memory, or "" without a
memory limit. */}}
{{- define "dam.goMemLimit" -}}
{{- $limit := dig "limits" "memory" "" (.Values.resources | default dict) }}
{{- if $limit }}
{{- $bytes := include "dam.bytes" (list "resources.limits.memory" $limit) | float64 }}
{{- printf "%d" (mulf $bytes .Values.goMemLimitRatio | floor | int64) }}
{{- end }}
{{- end }}

{{/* Where the secret files are mounted, by purpose. */}}
{{- define "dam.dsnFile" -}}
{{- printf "%s/postgres-dsn" (trimSuffix "/" .Values.secret.mountPath) }}
{{- end }}
{{- define "dam.saslPasswordFile" -}}
{{- printf "%s/kafka-sasl-password" (trimSuffix "/" .Values.secret.mountPath) }}
{{- end }}

{{/* dam.yaml: the values' config and routes, with what the chart owns
(http.listen, postgres.migrate) and the group's default. */}}
{{- define "dam.config" -}}
{{- $cfg := deepCopy .Values.config }}
{{- $kafka := $cfg.kafka }}
{{- if not $kafka.group }}
{{- $_ := set $kafka "group" (include "dam.fullname" .) }}
{{- end }}
{{- $_ := set $cfg.postgres "migrate" (eq .Values.migrate "atStart") }}
{{- $_ := set $cfg "http" (dict "listen" (printf ":%d" (int .Values.service.port))) }}
{{- $_ := set $cfg "routes" .Values.routes }}
{{- toYaml $cfg }}
{{- end }}

{{/* Refuses values that contradict each other or cannot work; called
from the Deployment, so that every render checks them. */}}
{{- define "dam.validate" -}}
{{- $v := .Values }}
{{- if not $v.secret.name }}
{{- fail "secret.name: required: the name of an existing Secret holding the PostgreSQL DSN (key secret.dsnKey)" }}
{{- end }}
{{- if not $v.config.kafka.brokers }}
{{- fail "config.kafka.brokers: required: at least one host:port" }}
{{- end }}
{{- if not $v.routes }}
{{- fail "routes: at least one route is required" }}
{{- end }}
{{- $froms := dict }}
{{- $services := dict }}
{{- range $i, $r := $v.routes }}
{{- if hasKey $froms $r.from }}
{{- fail (printf "routes[%d].from: topic %q is already read by routes[%d]" $i $r.from (get $froms $r.from)) }}
{{- end }}
{{- $_ := set $froms $r.from $i }}
{{- if hasKey $services $r.service }}
{{- fail (printf "routes[%d].service: %q is already the service of routes[%d]" $i $r.service (get $services $r.service)) }}
{{- end }}
{{- $_ := set $services $r.service $i }}
{{- end }}
{{- range $i, $r := $v.routes }}
{{- if eq $r.to $r.from }}
{{- fail (printf "routes[%d].to: %q is also the route's from: a loop" $i $r.to) }}
{{- end }}
{{- if hasKey $froms $r.to }}
{{- fail (printf "routes[%d].to: topic %q is the from topic of routes[%d]: a loop" $i $r.to (get $froms $r.to)) }}
{{- end }}
{{- with $r.dead_letter }}
{{- if hasKey $froms . }}
{{- fail (printf "routes[%d].dead_letter: topic %q is the from topic of routes[%d]: a loop" $i . (get $froms .)) }}
{{- end }}
{{- if eq . $r.to }}
{{- fail (printf "routes[%d].dead_letter: topic %q is also the route's to topic" $i .) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $v.config.kafka.sasl.mechanism }}
{{- if not $v.config.kafka.sasl.username }}
{{- fail "config.kafka.sasl.username: required with config.kafka.sasl.mechanism" }}
{{- end }}
{{- if not $v.secret.saslPasswordKey }}
{{- fail "secret.saslPasswordKey: required with config.kafka.sasl.mechanism: the key of secret.name holding the SASL password" }}
{{- end }}
{{- end }}
{{- if and $v.inputPartitions (gt (int $v.replicaCount) (int $v.inputPartitions)) }}
{{- fail (printf "replicaCount (%d) exceeds inputPartitions (%d): the extra replicas would own no partition" (int $v.replicaCount) (int $v.inputPartitions)) }}
{{- end }}
{{- if and $v.podDisruptionBudget.enabled (include "dam.isSet" $v.podDisruptionBudget.minAvailable) (include "dam.isSet" $v.podDisruptionBudget.maxUnavailable) }}
{{- fail "podDisruptionBudget: set minAvailable or maxUnavailable, not both (set the other to null)" }}
{{- end }}
{{- $_ := include "dam.terminationGracePeriodSeconds" . }}
{{- end }}

{{/* The environment of the dam containers: the secrets' files
(secret.as: file) or values (secret.as: env), then extraEnv. */}}
{{- define "dam.env" -}}
{{- $sasl := .Values.config.kafka.sasl.mechanism }}
{{- if eq .Values.secret.as "file" }}
- name: DAM_POSTGRES_DSN_FILE
  value: {{ include "dam.dsnFile" . }}
{{- if $sasl }}
- name: DAM_KAFKA_SASL_PASSWORD_FILE
  value: {{ include "dam.saslPasswordFile" . }}
{{- end }}
{{- else }}
- name: DAM_POSTGRES_DSN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.secret.name }}
      key: {{ .Values.secret.dsnKey }}
{{- if $sasl }}
- name: DAM_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.secret.name }}
      key: {{ .Values.secret.saslPasswordKey }}
{{- end }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The volume mounts of the dam containers. */}}
{{- define "dam.volumeMounts" -}}
- name: config
  mountPath: /etc/dam/dam.yaml
  subPath: dam.yaml
  readOnly: true
{{- if eq .Values.secret.as "file" }}
- name: secrets
  mountPath: {{ .Values.secret.mountPath }}
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* "true" when a value is set: neither null nor "" (0 is set). */}}
{{- define "dam.isSet" -}}
{{- if and (not (kindIs "invalid" .)) (ne (toString .) "") }}true{{ end }}
{{- end }}
