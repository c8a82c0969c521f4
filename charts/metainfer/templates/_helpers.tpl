{{/* Names and labels shared by every template. */}}
{{- define "metainfer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "metainfer.fullname" -}}
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

{{- define "metainfer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of the chart's own objects. Not managed-by=metainfer: that label marks the operator's children. */}}
{{- define "metainfer.labels" -}}
helm.sh/chart: {{ include "metainfer.chart" . }}
app.kubernetes.io/name: {{ include "metainfer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: metainfer
{{- end }}

{{- define "metainfer.operatorSelector" -}}
app.kubernetes.io/name: {{ include "metainfer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* A ServiceAccount the chart does not create must be named: a generated name would match nothing. */}}
{{- define "metainfer.operatorServiceAccount" -}}
{{- $sa := .Values.operator.serviceAccount }}
{{- if and (not $sa.create) (not $sa.name) }}
{{- fail "operator.serviceAccount.name must name the existing ServiceAccount when operator.serviceAccount.create is false" }}
{{- end }}
{{- default (printf "%s-operator" (include "metainfer.fullname" .)) $sa.name }}
{{- end }}

{{/* Adaptation Jobs' ServiceAccount in each workload namespace (the operator gets it as METAINFER_AGENT_SERVICE_ACCOUNT). */}}
{{- define "metainfer.agentServiceAccount" -}}
{{- .Values.agent.serviceAccount.name }}
{{- end }}

{{/* Serving pods' ServiceAccount in each workload namespace (METAINFER_SERVING_SERVICE_ACCOUNT). */}}
{{- define "metainfer.servingServiceAccount" -}}
{{- .Values.serving.serviceAccount.name }}
{{- end }}

{{- define "metainfer.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "metainfer.agentImage" -}}
{{- default (include "metainfer.image" .) .Values.agent.image }}
{{- end }}

{{/* METAINFER_AGENT_IMAGES: agent.vendorImages resolved to {"<vendor>": {"image": ..., "runtime": ...}}; a null
entry is left out (its classes are refused). */}}
{{- define "metainfer.vendorImages" -}}
{{- $out := dict }}
{{- range $vendor, $entry := (.Values.agent.vendorImages | default dict) }}
{{- if $entry }}
{{- $image := "" }}
{{- if $entry.image }}
{{- $image = $entry.image }}
{{- else if $entry.digest }}
{{- $image = printf "%s@%s" $.Values.image.repository $entry.digest }}
{{- else if $entry.flavour }}
{{- $image = printf "%s:%s-%s" $.Values.image.repository (default $.Chart.AppVersion $.Values.image.tag) $entry.flavour }}
{{- else }}
{{- fail (printf "agent.vendorImages.%s names no flavour, digest or image (null refuses %s classes)" $vendor $vendor) }}
{{- end }}
{{- $item := dict "image" $image }}
{{- with $entry.runtime }}
{{- $_ := set $item "runtime" . }}
{{- end }}
{{- $_ := set $out $vendor $item }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* Workload namespaces as a list: the values' list, or the release namespace. */}}
{{- define "metainfer.workloadNamespaces" -}}
{{- $list := .Values.workloadNamespaces | default (list .Release.Namespace) | uniq }}
{{- toJson $list }}
{{- end }}

{{- define "metainfer.labelMappingPath" -}}
/etc/metainfer/label-mapping/mapping.yaml
{{- end }}

{{/* runbook_url of an alert: prometheusRule.runbookBaseURL (where the team hosts docs/runbooks.md), else the
relative reference to the runbook shipped in the project's docs. Argument: (list $ "anchor"). */}}
{{- define "metainfer.runbook" -}}
{{- $root := index . 0 -}}
{{- $base := $root.Values.prometheusRule.runbookBaseURL | default "docs/runbooks.md" -}}
{{- printf "%s#%s" $base (index . 1) -}}
{{- end }}

{{/*
Per-alert switches from prometheusRule.alerts.<AlertName>: "true" when the alert is rendered (the default), and
its labels: severity from the alert's settings, then the alert's extra labels (which may override it).
*/}}
{{- define "metainfer.alertOn" -}}
{{- $root := index . 0 -}}
{{- $settings := index ($root.Values.prometheusRule.alerts | default dict) (index . 1) | default dict -}}
{{- if ne (toString (dig "enabled" true $settings)) "false" }}true{{ end -}}
{{- end }}

{{- define "metainfer.alertLabels" -}}
{{- $root := index . 0 -}}
{{- $settings := index ($root.Values.prometheusRule.alerts | default dict) (index . 1) | default dict -}}
{{- toYaml (mergeOverwrite (dict "severity" (index . 2)) ($settings.labels | default dict)) -}}
{{- end }}

{{/*
Values reused from an older chart (helm upgrade --reuse-values keeps the previous release's values and not this
chart's new defaults) lack the sections this chart added, and a template reading one would stop on a nil pointer
that names no cause. Each template reading an added section includes this first: it says what happened and what
to run instead.
*/}}
{{- define "metainfer.valuesCheck" -}}
{{- $missing := list }}
{{- /* Every value added since chart 0.1.0 whose absence would change what the chart renders (a null proxy or
workload-identity switch renders as its default and is not listed; tests/integration/test_chart_render.py derives
the added values from git and fails when one is in neither list). */ -}}
{{- $added := list "crds" "networkPolicy" "operator.podDisruptionBudget" "agent.vendorImages"
    "serving.shutdownDelayMaxSeconds" }}
{{- range $path := $added }}
{{- $node := $.Values }}
{{- $found := true }}
{{- range $part := splitList "." $path }}
{{- if and $found (kindIs "map" $node) (hasKey $node $part) }}{{ $node = index $node $part }}{{ else }}{{ $found = false }}{{ end }}
{{- end }}
{{- if not $found }}{{ $missing = append $missing $path }}{{ end }}
{{- end }}
{{- if $missing }}
{{- fail (printf "values %s are missing: they come from an older chart (helm upgrade --reuse-values reuses the previous release's values without this chart's new defaults). Upgrade with --reset-then-reuse-values, or pass your values with -f (docs/helm.md#upgrading-from-chart-010)" (join ", " $missing)) }}
{{- end }}
{{- end }}
