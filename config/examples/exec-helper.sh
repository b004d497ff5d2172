#!/bin/sh
# An example helper for a provider of kind exec (config/driver.yaml: providers), speaking the FUSE
# flexVolume design's protocol. A directory stands in for a vault CLI: each pod is served the
# files of ROOT/<its namespace>/<its name>/, so the pod's identity, passed by the driver, is what
# picks its secrets. A real helper would ask its vault as the node, passing the same identity.
#   HELPER mount MOUNTPOINT JSON     answers the directories served, the keys of JSON to pass on
#                                    each get, and (for eager mode) the files of each directory
#   HELPER get PATH NAMESPACE POD    prints one file
# The driver runs it without a shell, with only PATH in its environment.
set -eu
ROOT=/var/lib/inline-guard/example-vault

# A value of the mount options: the driver writes compact JSON, and names are DNS labels. The
# key is matched where a key of the object stands, right after its `{` or `,`: inside a string,
# every quote is escaped (`\"`), so text that a pod puts in an attribute (a key such as
# `zz","kubernetes.io/pod.namespace`, which sorts after the real one) can never stand there and
# pass for the pod's identity, as it could for a match found anywhere, the last one winning.
option() {
    printf '%s' "$2" | sed -n "s/.*[{,]\"$1\":\"\([a-z0-9.-]*\)\"[,}].*/\1/p"
}

case "${1:-}" in
mount)
    namespace=$(option 'kubernetes\.io\/pod\.namespace' "$3")
    pod=$(option 'kubernetes\.io\/pod\.name' "$3")
    [ -n "$namespace" ] && [ -n "$pod" ] || { echo "no pod identity in the mount options" >&2; exit 1; }
    dir="$ROOT/$namespace/$pod"
    [ -d "$dir" ] || { echo "nothing is kept for pod $namespace/$pod" >&2; exit 1; }
    # The design's answer, trailing comma included, with the files listed for eager mode.
    printf '{\n  "enable-dirs": ["secrets"],\n  "mount-param": ["kubernetes.io/pod.namespace", "kubernetes.io/pod.name"],\n  "files": {"secrets": ['
    separator=''
    for file in "$dir"/*; do
        [ -f "$file" ] || continue
        printf '%s"%s"' "$separator" "$(basename "$file")"
        separator=', '
    done
    printf ']},\n}\n'
    ;;
get)
    path=$2 namespace=$3 pod=$4
    name=${path#secrets/}
    case "$namespace/$pod/$name" in
    */*/*/* | .* | */.* ) echo "refused: $path" >&2; exit 1 ;;
    esac
    [ "$path" = "secrets/$name" ] || { echo "no such file: $path" >&2; exit 1; }
    cat "$ROOT/$namespace/$pod/$name"
    ;;
*)
    echo "unknown call: ${1:-none}" >&2
    exit 1
    ;;
esac
