{{- /*
banlieue.documents: the YAML documents of the shipped manifests matching `glob` (files/ links
to deploy/), parsed, as a JSON list. The chart renders the objects `banlieue bootstrap` applies
from the same files, never from a copy of them. A document that does not parse fails the render.
*/ -}}
{{- define "banlieue.documents" -}}
{{- $docs := list -}}
{{- range $path, $bytes := .root.Files.Glob .glob -}}
{{- range $text := regexSplit "(?m)^---[ \t]*$" (toString $bytes) -1 -}}
{{- $doc := fromYaml $text -}}
{{- if hasKey $doc "Error" -}}
{{- fail (printf "%s: %s" $path $doc.Error) -}}
{{- end -}}
{{- if $doc -}}
{{- $docs = append $docs $doc -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $docs -}}
{{- end -}}
