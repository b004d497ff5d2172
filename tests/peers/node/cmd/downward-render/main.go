// Command downward-render prints a map as kubelet's downward API writes it into a volume file:
// it reads a JSON object of strings on standard input and writes fieldpath.FormatMap of it,
// the very function kubelet calls for metadata.labels and metadata.annotations, so the driver's
// rendering can be compared with kubelet's byte for byte (Go's printable table included).
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/kubernetes/pkg/fieldpath"
)

func main() {
	var values map[string]string
	if err := json.NewDecoder(os.Stdin).Decode(&values); err != nil {
		fmt.Fprintln(os.Stderr, "downward-render: standard input is not a JSON object of strings:", err)
		os.Exit(2)
	}
	os.Stdout.WriteString(fieldpath.FormatMap(values))
}
