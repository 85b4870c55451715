{{/* Names and labels shared by every template. */}}

{{- define "gang-extender.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-scoped name: two releases in one cluster never collide. */}}
{{- define "gang-extender.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gang-extender.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gang-extender.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gang-extender.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "gang-extender.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "gang-extender.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gang-extender.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gang-extender.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "gang-extender.fullname" .)) .Values.tls.secretName -}}
{{- end -}}

{{- define "gang-extender.leaseName" -}}
{{- default (include "gang-extender.fullname" .) .Values.scheduler.leaderElection.resourceName -}}
{{- end -}}

{{/* Where the TLS Secret is mounted in both containers. */}}
{{- define "gang-extender.tlsDir" -}}/etc/gang-extender/tls{{- end -}}

{{/* Settings that cannot be expressed in values.schema.json. */}}
{{- define "gang-extender.validate" -}}
{{- $ext := .Values.extender -}}
{{- if le (float64 .Values.scheduler.extender.httpTimeoutSeconds) (float64 $ext.maxPermitWaitingTimeSeconds) -}}
{{- fail (printf "scheduler.extender.httpTimeoutSeconds (%v) must be longer than extender.maxPermitWaitingTimeSeconds (%v): kube-scheduler would give up on a gang member's bind call while it still waits in the permit gate" .Values.scheduler.extender.httpTimeoutSeconds $ext.maxPermitWaitingTimeSeconds) -}}
{{- end -}}
{{- if gt (float64 $ext.permitWaitingTimeSeconds) (float64 $ext.maxPermitWaitingTimeSeconds) -}}
{{- fail (printf "extender.permitWaitingTimeSeconds (%v) exceeds extender.maxPermitWaitingTimeSeconds (%v)" $ext.permitWaitingTimeSeconds $ext.maxPermitWaitingTimeSeconds) -}}
{{- end -}}
{{- if eq (int $ext.port) (int $ext.opsPort) -}}
{{- fail "extender.port and extender.opsPort must differ" -}}
{{- end -}}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.enabled) -}}
{{- fail "tls.certManager.enabled needs tls.enabled: the certificate is only used for the scheduler-to-extender TLS link" -}}
{{- end -}}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.certManager.issuerRef.name) -}}
{{- fail "tls.certManager.enabled needs tls.certManager.issuerRef.name (a CA Issuer or ClusterIssuer)" -}}
{{- end -}}
{{- if and .Values.serveDefaultScheduler (eq .Values.schedulerName "default-scheduler") -}}
{{- fail "schedulerName is already default-scheduler: leave serveDefaultScheduler off" -}}
{{- end -}}
{{- end -}}
