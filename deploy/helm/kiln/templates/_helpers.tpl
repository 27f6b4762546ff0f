{{/* Labels every object carries; "name" is the component's app.kubernetes.io/name. */}}
{{- define "kiln.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: kiln
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kiln.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ .Values.serviceAccount.name }}{{- else -}}default{{- end -}}
{{- end -}}

{{/* The pod securityContext of every kiln pod: the image's kiln user, Secret files readable through its group. */}}
{{- define "kiln.podSecurity" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "kiln.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The agents' pods: root, for the ranks' sandbox (docs/security.md; deploy/README.md, "The agents' sandbox"). */}}
{{- define "kiln.agentPodSecurity" -}}
runAsUser: 0
runAsGroup: 0
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The agent's container: exactly the capabilities the sandbox uses, no privileged; seccomp and
     AppArmor off (RuntimeDefault refuses pivot_root, the runtimes' AppArmor profiles mount). */}}
{{- define "kiln.agentContainerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
  add: ["SYS_ADMIN", "SYS_CHROOT", "SETUID", "SETGID", "SETPCAP", "CHOWN", "DAC_READ_SEARCH", "KILL", "SYS_PTRACE"]
seccompProfile:
  type: Unconfined
appArmorProfile:
  type: Unconfined
{{- end -}}

{{/* The image of kilnd and the CPU agents, and of the GPU agents: the tags default to the chart's appVersion. */}}
{{- define "kiln.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- define "kiln.cudaImage" -}}
{{ .Values.image.repository }}:{{ .Values.image.cudaTag | default (printf "%s-cuda" .Chart.AppVersion) }}
{{- end -}}

{{/* Values the schema cannot judge alone: refused with a message saying what to change. */}}
{{- define "kiln.validate" -}}
{{- $a := .Values.kilnd.artifacts -}}
{{- if and (gt (int .Values.kilnd.replicas) 1) (eq $a.accessMode "ReadWriteOnce") (not $a.existingClaim) -}}
{{- fail (printf "kilnd.replicas is %d but kilnd.artifacts.accessMode is ReadWriteOnce: replicas share one artifact volume, which then needs ReadWriteMany (a storage class that offers it: NFS, CephFS, EFS, Filestore); or set kilnd.replicas to 1" (int .Values.kilnd.replicas)) -}}
{{- end -}}
{{- end -}}
