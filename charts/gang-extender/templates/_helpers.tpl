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
{{- if and .Values.webhook.certManager.enabled (not .Values.webhook.certManager.issuerRef.name) -}}
{{- fail "webhook.certManager.enabled needs webhook.certManager.issuerRef.name" -}}
{{- end -}}
{{- if and .Values.webhook.existingSecret (not .Values.webhook.caBundle) -}}
{{- fail "webhook.existingSecret needs webhook.caBundle (base64 PEM of the CA that signed it)" -}}
{{- end -}}
{{- if and (eq .Values.mode "gang-only") (or (eq (int .Values.webhook.port) (int $ext.port)) (eq (int .Values.webhook.port) (int $ext.opsPort))) -}}
{{- fail "webhook.port must differ from extender.port and extender.opsPort" -}}
{{- end -}}
{{- if and .Values.serveDefaultScheduler (eq .Values.schedulerName "default-scheduler") -}}
{{- fail "schedulerName is already default-scheduler: leave serveDefaultScheduler off" -}}
{{- end -}}
{{- end -}}

{{- define "gang-extender.quoteNames" -}}
{{- $quoted := list -}}
{{- range . -}}{{- $quoted = append $quoted (printf "'%s'" .) -}}{{- end -}}
{{- $quoted | join ", " -}}
{{- end -}}

{{/* The Service's DNS names: the webhook certificate's SANs. */}}
{{- define "gang-extender.webhookHosts" -}}
{{- $svc := include "gang-extender.webhookServiceName" . -}}
{{- $ns := .Release.Namespace -}}
{{- printf "%s.%s.svc,%s.%s.svc.cluster.local,%s.%s,%s" $svc $ns $svc $ns $svc $ns $svc -}}
{{- end -}}


{{/* gang-only mode (docs/deployment-modes.md): the member-mark webhook and its policy. */}}
{{- define "gang-extender.gangOnly" -}}
{{- if eq .Values.mode "gang-only" -}}true{{- end -}}
{{- end -}}

{{- define "gang-extender.webhookServiceName" -}}
{{- printf "%s-webhook" (include "gang-extender.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gang-extender.webhookSecretName" -}}
{{- default (printf "%s-webhook-cert" (include "gang-extender.fullname" .)) .Values.webhook.secretName -}}
{{- end -}}

{{/* Where the webhook's certificate Secret is mounted (cert-manager or your own Secret). */}}
{{- define "gang-extender.webhookCertDir" -}}/etc/gang-extender/webhook{{- end -}}

{{/* The schedulers whose pods are marked: the chart's profiles only. */}}
{{- define "gang-extender.schedulerNames" -}}
{{- $names := list .Values.schedulerName -}}
{{- if .Values.serveDefaultScheduler -}}{{- $names = append $names "default-scheduler" -}}{{- end -}}
{{- $names | join "," -}}
{{- end -}}

{{/* CEL, the same as app/core/marking.py's member_expression() (tests/packaging/test_chart.py compares). */}}
{{- define "gang-extender.isMember" -}}
(has(object.metadata.labels) && 'scheduling.x-k8s.io/pod-group' in object.metadata.labels) || (has(object.metadata.labels) && 'pod-group.scheduling.sigs.k8s.io/name' in object.metadata.labels) || (has(object.metadata.labels) && 'kueue.x-k8s.io/pod-group-name' in object.metadata.labels) || (has(object.metadata.annotations) && 'scheduling.k8s.io/group-name' in object.metadata.annotations) || (has(object.metadata.annotations) && 'scheduling.volcano.sh/group-name' in object.metadata.annotations) || (has(object.metadata.annotations) && 'pod-group-name' in object.metadata.annotations) || (has(object.metadata.annotations) && 'yunikorn.apache.org/task-groups' in object.metadata.annotations) || (has(object.metadata.annotations) && 'yunikorn.apache.org/task-group-name' in object.metadata.annotations) || (has(object.spec.schedulingGroup) && has(object.spec.schedulingGroup.podGroupName) && object.spec.schedulingGroup.podGroupName != ''){{- if eq (.Values.extender.groupSources.lws | default "off") "on" }} || (has(object.metadata.labels) && 'leaderworkerset.sigs.k8s.io/name' in object.metadata.labels){{- end }}
{{- end -}}

{{/* CEL, the same as app/core/marking.py's preemptor_expression(). */}}
{{- define "gang-extender.canPreempt" -}}
has(object.spec.priority) && object.spec.priority > 0 && (!has(object.spec.preemptionPolicy) || object.spec.preemptionPolicy != 'Never')
{{- end -}}

{{- define "gang-extender.preemptorMutation" -}}
Object{spec: Object.spec{containers: object.spec.containers.map(c, Object.spec.containers{name: c.name, resources: Object.spec.containers.resources{requests: {'gang-extender.dev/preemptor': '0'}, limits: {'gang-extender.dev/preemptor': '0'}}})}}
{{- end -}}

{{- define "gang-extender.memberValid" -}}
(has(object.spec.containers) && object.spec.containers.exists(c, has(c.resources) && ((has(c.resources.requests) && 'gang-extender.dev/member' in c.resources.requests) || (has(c.resources.limits) && 'gang-extender.dev/member' in c.resources.limits)))) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) && ((has(c.resources.requests) && 'gang-extender.dev/member' in c.resources.requests) || (has(c.resources.limits) && 'gang-extender.dev/member' in c.resources.limits)))) || (request.operation == 'UPDATE' && ((has(oldObject.metadata.labels) && 'scheduling.x-k8s.io/pod-group' in oldObject.metadata.labels) || (has(oldObject.metadata.labels) && 'pod-group.scheduling.sigs.k8s.io/name' in oldObject.metadata.labels) || (has(oldObject.metadata.labels) && 'kueue.x-k8s.io/pod-group-name' in oldObject.metadata.labels) || (has(oldObject.metadata.annotations) && 'scheduling.k8s.io/group-name' in oldObject.metadata.annotations) || (has(oldObject.metadata.annotations) && 'scheduling.volcano.sh/group-name' in oldObject.metadata.annotations) || (has(oldObject.metadata.annotations) && 'pod-group-name' in oldObject.metadata.annotations) || (has(oldObject.metadata.annotations) && 'yunikorn.apache.org/task-groups' in oldObject.metadata.annotations) || (has(oldObject.metadata.annotations) && 'yunikorn.apache.org/task-group-name' in oldObject.metadata.annotations) || (has(oldObject.spec.schedulingGroup) && has(oldObject.spec.schedulingGroup.podGroupName) && oldObject.spec.schedulingGroup.podGroupName != '')))
{{- end -}}

{{- define "gang-extender.refusal" -}}
gang member without the gang-extender.dev/member resource: gang-extender's admission webhook did not mark this pod (is the extender running and its MutatingWebhookConfiguration registered?), and an unmarked member would be bound by kube-scheduler without the gang gate; create the pod again once the webhook answers (controllers retry on their own). A pod cannot join a group after its creation either: create it with the group's label, annotation or schedulingGroup
{{- end -}}

{{/* kube-scheduler's TLS settings for one extender entry (tls.enabled). */}}
{{- define "gang-extender.extenderTLS" -}}
{{- if .Values.tls.enabled -}}
enableHTTPS: true
tlsConfig:
  # The pod's certificate serves as kube-scheduler's client certificate.
  caFile: {{ include "gang-extender.tlsDir" . }}/ca.crt
  certFile: {{ include "gang-extender.tlsDir" . }}/tls.crt
  keyFile: {{ include "gang-extender.tlsDir" . }}/tls.key
{{- end -}}
{{- end -}}
