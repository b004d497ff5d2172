{{- /*
The driver's memory limit against what its configuration lets it hold, as the driver computes it
(`DriverConfig::memory_needed`, driver/src/config.rs): the content budget, the eighth over it an
update may take while both versions are held, the content of the operations in flight before the
budget counts it (8 publishes, 8 refreshes and the 4 helpers of helperConcurrency, each at most
tmpfsSize), and 64Mi for the process. A limit below it lets the kernel kill the driver before the
budget refuses anything, so the chart refuses to render it (tests/tests/chart.rs renders one byte
below and at it, against the driver's own figure).
*/}}

{{- /* A Kubernetes quantity of bytes (a whole number, with Ki, Mi, Gi, Ti, k, M, G or T) as a number. */}}
{{- define "inline-guard.bytes" -}}
{{- $quantity := toString . -}}
{{- $units := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- $number := regexFind "^[0-9]+" $quantity -}}
{{- $unit := trimPrefix $number $quantity -}}
{{- if or (not $number) (not (hasKey $units $unit)) -}}
{{- fail (printf "%q is not a quantity of bytes this chart reads: a whole number, with Ki, Mi, Gi, Ti, k, M, G or T" (trunc 100 $quantity)) -}}
{{- end -}}
{{- mul (int64 $number) (get $units $unit) -}}
{{- end -}}

{{- define "inline-guard.driver.memoryCheck" -}}
{{- $driver := .Values.driver -}}
{{- $limit := dig "resources" "limits" "memory" "" $driver -}}
{{- if $limit -}}
{{- $budget := int64 (include "inline-guard.bytes" $driver.contentBudget) -}}
{{- $tmpfs := int64 (include "inline-guard.bytes" $driver.tmpfsSize) -}}
{{- $inFlight := 20 -}}
{{- $needed := add $budget (div $budget 8) (mul $inFlight $tmpfs) 67108864 -}}
{{- if lt (int64 (include "inline-guard.bytes" $limit)) $needed -}}
{{- fail (printf "driver.resources.limits.memory %s is below the %d bytes the driver's configuration lets it hold (contentBudget %s, an eighth over it while an update is written, %d operations in flight of tmpfsSize %s each, and 64Mi for the process): raise the limit, or lower contentBudget or tmpfsSize" (toString $limit) $needed (toString $driver.contentBudget) $inFlight (toString $driver.tmpfsSize)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
