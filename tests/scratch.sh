# Sourced by tests/cold/run and tests/mutation/run: their scratch directories' owner and removal.

# The start time of process $1 (empty when it is gone): with its pid, it names a run, so that a
# reused pid is never taken for the run that made a scratch directory.
start_time() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | awk '{print $20}' || true; }

# A scratch directory's mounts (a test killed mid-way may leave some) go before its files, and
# nothing is removed across a filesystem boundary: a bind mount of the host left behind must
# stop the removal, never be followed into.
remove_scratch() {
    local dir=$1
    findmnt -rn -o TARGET | awk -v d="$dir/" 'index($0, d) == 1' | sort -r | while read -r mount; do
        umount -l "$mount" 2>/dev/null || true
    done
    # Go's module cache is read-only by design.
    chmod -R u+w "$dir" 2>/dev/null || true
    rm -rf --one-file-system "$dir"
}
