"""The bookkeeping of tests/mutation/run, in four commands:

  report.py scope               checks scope.tsv: each path names at least one tracked file;
                                prints the pieces, one per line
  report.py record PIECE OUTCOMES TREE SECONDS
                                turns cargo-mutants' outcomes.json of one piece into the committed
                                outcomes/PIECE.json (on stdout): each mutant's file, name, outcome
  report.py survivors PIECE     the mutants of PIECE's committed outcomes to test again: the
                                survivors not listed in equivalent.tsv, and those listed there
                                that a test caught (a listed mutant behaves as the original, so
                                its catch was a test failing for another reason: it is tested
                                again to tell); one anchored regular expression per line (for
                                cargo-mutants' --re); fails if the piece was not run
  report.py merge PIECE OUTCOMES TREE SECONDS
                                PIECE's committed outcomes with the survivors' new outcomes from a
                                run of them alone on TREE (on stdout); the piece then names both
                                trees (one, when TREE is its own: the second stage of a whole
                                run) and its time is the sum; fails unless every mutant of
                                OUTCOMES was one `survivors` names
  report.py unchanged BASE PATH...
                                exits 1, naming the file, unless each tracked file the paths name
                                holds the same code at BASE as in the working tree above its test
                                module (a trailing `#[cfg(test)] mod tests`): tests may change
  report.py adopt PIECE...      records in PIECE's outcomes, made before outcomes recorded them,
                                the digests of its code, when git shows that code unchanged since
                                the piece's tree (so that a shallow clone can tell it current);
                                fails, naming the file, for a piece whose code changed
  report.py report              REPORT.md (on stdout), from scope.tsv, outcomes/*.json and
                                equivalent.tsv
  report.py check               says on stderr what falls short and exits 1: a piece not run, a
                                scoped path no mutant of which was tested, a piece whose code
                                changed since it was run (stale: by the code hashes its
                                outcomes record, or by git for outcomes recorded before them,
                                which a shallow clone cannot tell and says so), a piece under 90 %, a
                                surviving mutant neither killed nor listed in equivalent.tsv (or
                                one listed there that no longer survives)

tests/tests/mutation_scope.rs checks in every test run that the report's rows are the ones the
committed outcomes make, so the report cannot claim what was not run.
"""

import fnmatch
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TARGET = 0.90
KINDS = {"CaughtMutant": "caught", "MissedMutant": "missed", "Unviable": "unviable", "Timeout": "timeout"}


def scope():
    """[(piece, path, why)] in file order."""
    lines = []
    with open(os.path.join(HERE, "scope.tsv")) as table:
        for number, line in enumerate(table, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            fields = line.split("\t")
            if len(fields) != 3 or not all(f.strip() for f in fields):
                sys.exit(f"scope.tsv:{number}: expected <piece>TAB<path>TAB<why>")
            lines.append(tuple(fields))
    return lines


def tracked_files():
    listed = subprocess.run(["git", "ls-files", "*.rs"], cwd=ROOT, capture_output=True, text=True, check=True)
    return listed.stdout.split()


def matches(pattern, file):
    """cargo-mutants' reading of a scope path: a file, or `dir/**` for everything below dir."""
    if pattern.endswith("/**"):
        return file.startswith(pattern[:-2])
    return fnmatch.fnmatchcase(file, pattern)


def check_scope():
    files = tracked_files()
    empty = [path for _, path, _ in scope() if not any(matches(path, f) for f in files)]
    if empty:
        for path in empty:
            print(f"tests/mutation/scope.tsv: {path} names no tracked file", file=sys.stderr)
        sys.exit(1)
    pieces = []
    for piece, _, _ in scope():
        if piece not in pieces:
            pieces.append(piece)
    print("\n".join(pieces))


def cpu_model():
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def record(piece, outcomes_path, tree, seconds):
    print(record_json(piece, outcomes_path, tree, seconds))


def record_json(piece, outcomes_path, tree, seconds):
    outcomes = json.load(open(outcomes_path))
    mutants = []
    for outcome in outcomes["outcomes"]:
        scenario = outcome["scenario"]
        if scenario == "Baseline":
            continue
        mutant = scenario["Mutant"]
        kind = KINDS.get(outcome["summary"], outcome["summary"])
        entry = {"file": mutant["file"], "name": mutant["name"], "outcome": kind}
        if kind == "caught":
            entry["killed_by"] = killers(os.path.dirname(outcomes_path), outcome.get("log_path"), mutant["file"])
        mutants.append(entry)
    mutants.sort(key=lambda m: (m["file"], m["name"]))
    tests = sorted({test for m in mutants for test in m.get("killed_by", [])})
    return json.dumps({
        "piece": piece,
        "tree": tree,
        "seconds": int(seconds),
        "machine": f"{os.cpu_count()} CPUs ({cpu_model()})",
        "cargo_mutants": outcomes.get("cargo_mutants_version", "?"),
        # What the mutants were made of, file by file: check compares it with the working tree
        # without git's history, so a shallow clone tells a stale piece too.
        "code": code_hashes([path for p, path, _ in scope() if p == piece]),
        # What each killing test was: a mutant whose every killer changed or went since is no
        # longer known to be caught, and its piece is stale (tests/tests/mutation_scope.rs).
        "tests": {test: test_hash(test) for test in tests},
        "mutants": mutants,
    }, indent=1)


def code_hashes(paths):
    """{file: sha256 of its code above its test module} for the tracked files `paths` name."""
    hashes = {}
    for file in tracked_files():
        if any(matches(path, file) for path in paths):
            with open(os.path.join(ROOT, file)) as now:
                hashes[file] = hashlib.sha256(code_of(now.read()).encode()).hexdigest()
    return hashes


def survivors(piece):
    data = recorded().get(piece)
    if data is None:
        sys.exit(f"tests/mutation: piece {piece} has no committed outcomes: run it whole first")
    for name in to_test_again(data, equivalents()):
        print("^" + re_escape(name) + "$")


def to_test_again(data, listed):
    """The mutants of one piece's outcomes that `tests/mutation/run --survivors` tests again."""
    return [m["name"] for m in data["mutants"]
            if (m["outcome"] == "missed" and m["name"] not in listed)
            or (m["outcome"] in ("caught", "timeout") and m["name"] in listed)]


def re_escape(text):
    """`text` as a regular expression matching only itself (cargo-mutants reads Rust's regex)."""
    return "".join("\\" + c if c in "\\.+*?()|[]{}^$#&-~" else c for c in text)


def merge(piece, outcomes_path, tree, seconds):
    data = recorded().get(piece)
    if data is None:
        sys.exit(f"tests/mutation: piece {piece} has no committed outcomes to merge into")
    rerun = json.loads(record_json(piece, outcomes_path, tree, seconds))
    by_name = {m["name"]: m for m in data["mutants"]}
    wanted = set(to_test_again(data, equivalents()))
    for mutant in rerun["mutants"]:
        before = by_name.get(mutant["name"])
        if before is None or mutant["name"] not in wanted:
            sys.exit(f"tests/mutation: {mutant['name']} was not a mutant of piece {piece} to test again")
        before["outcome"] = mutant["outcome"]
        before["tree"] = tree
        before.pop("killed_by", None)
        if "killed_by" in mutant:
            before["killed_by"] = mutant["killed_by"]
    if rerun["tests"]:
        data.setdefault("tests", {}).update(rerun["tests"])
    # The second stage of a whole run is on the piece's own tree: nothing to name twice.
    if tree != data["tree"]:
        data["tree"] = f"{data['tree']}; survivors on {tree}"
    data["seconds"] = int(data["seconds"]) + int(seconds)
    print(json.dumps(data, indent=1))


def killers(out_dir, log_path, mutated_file):
    """The tests that failed against one mutant, from its log: `TARGET::TEST` where TARGET is the
    test target's source (`driver/src/lib.rs` for the unit tests, `driver/tests/binary.rs`) and
    TEST libtest's full name. Empty when no test is named (a crash of the whole binary)."""
    if not log_path:
        return []
    try:
        log = open(os.path.join(out_dir, log_path), errors="replace").read()
    except OSError:
        return []
    crate = crate_of(mutated_file)
    tracked = set(tracked_files())
    found, target = set(), None
    for line in log.split("\n"):
        # cargo's verbose line for a test binary: `Running `/…/deps/NAME-HASH``; an integration
        # test's NAME is its file's, any other is the crate's own (its unit tests).
        running = re.match(r"\s+Running `\S*/deps/([A-Za-z0-9_]+)-[0-9a-f]+(?: [^`]*)?`$", line)
        if running:
            integration = f"{crate}/tests/{running.group(1)}.rs"
            target = integration if integration in tracked else f"{crate}/src/lib.rs"
            continue
        failed = re.match(r"test (\S+) \.\.\. FAILED$", line.strip())
        if failed and target:
            found.add(f"{target}::{failed.group(1)}")
    return sorted(found)


def crate_of(file):
    """The directory of the package holding `file` (the nearest with a Cargo.toml)."""
    parts = file.split("/")[:-1]
    while parts:
        if os.path.exists(os.path.join(ROOT, *parts, "Cargo.toml")):
            return "/".join(parts)
        parts.pop()
    return ""


def test_sources(target):
    """The tracked files a test target's tests may be written in: its crate's `src/` for the unit
    tests, its crate's `tests/` for an integration test."""
    crate, _, rest = target.rpartition("/src/") if "/src/" in target else target.rpartition("/tests/")
    below = f"{crate}/src/" if "/src/" in target else f"{crate}/tests/"
    return sorted(f for f in tracked_files() if f.startswith(below))


def test_text(source, name):
    """The text of every `fn NAME` in `source` as rustfmt writes it: from its `fn` line to the
    first line after it that closes at the same indentation; the texts joined."""
    lines = source.split("\n")
    texts = []
    pattern = re.compile(r"^(\s*)(?:pub(?:\([a-z]+\))? )?(?:async )?fn " + re.escape(name) + r"\s*[(<]")
    for number, line in enumerate(lines):
        start = pattern.match(line)
        if not start:
            continue
        closing = start.group(1) + "}"
        end = next((i for i in range(number + 1, len(lines)) if lines[i] == closing), len(lines) - 1)
        texts.append("\n".join(lines[number:end + 1]))
    return "\n".join(texts)


def test_hash(test):
    """The sha256 of a killing test's text (`TARGET::TEST`), over every file its target's tests may
    be in, in path order; the digest of nothing when no such function is left."""
    target, _, name = test.partition("::")
    function = name.rsplit("::", 1)[-1]
    texts = []
    for file in test_sources(target):
        with open(os.path.join(ROOT, file), errors="replace") as source:
            text = test_text(source.read(), function)
        if text:
            texts.append(text)
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()


def code_of(text):
    """`text` without its trailing test module: what mutants are made of."""
    lines = text.split("\n")
    for number in range(len(lines) - 1):
        if lines[number].strip() == "#[cfg(test)]" and lines[number + 1].startswith("mod tests"):
            return "\n".join(lines[:number])
    return text


def has_commit(base):
    """Whether this clone holds the commit `base` (a shallow clone may not)."""
    known = subprocess.run(["git", "cat-file", "-e", f"{base}^{{commit}}"], cwd=ROOT, capture_output=True)
    return known.returncode == 0


def changed_since(base, paths):
    """The tracked files `paths` name whose code (above a trailing test module) differs at
    `base` from the working tree, or that `base` does not have."""
    files = [f for f in tracked_files() if any(matches(path, f) for path in paths)]
    changed = []
    for file in files:
        before = subprocess.run(["git", "show", f"{base}:{file}"], cwd=ROOT, capture_output=True, text=True)
        with open(os.path.join(ROOT, file)) as now:
            if before.returncode != 0 or code_of(before.stdout) != code_of(now.read()):
                changed.append(file)
    return changed


def unchanged(base, paths):
    if not has_commit(base):
        sys.exit(f"tests/mutation: {base} is not in this clone (a shallow clone: git fetch --unshallow)")
    changed = changed_since(base, paths)
    for file in changed:
        print(f"tests/mutation: {file}: its code changed since {base} (not only its tests)", file=sys.stderr)
    sys.exit(1 if changed else 0)


def adopt(pieces):
    """Adds the code digests to old outcomes whose code is unchanged since their tree."""
    runs = recorded()
    failed = False
    for piece in pieces:
        data = runs.get(piece)
        if data is None:
            sys.exit(f"tests/mutation: piece {piece} has no committed outcomes")
        if "code" in data:
            print(f"tests/mutation: piece {piece} already records its code", file=sys.stderr)
            continue
        base = base_of(data)
        if not has_commit(base):
            sys.exit(f"tests/mutation: {base} is not in this clone (a shallow clone: git fetch --unshallow)")
        paths = [path for p, path, _ in scope() if p == piece]
        changed = changed_since(base, paths)
        if changed:
            failed = True
            for file in changed:
                print(f"tests/mutation: piece {piece}: the code of {file} changed since {base}: rerun it", file=sys.stderr)
            continue
        # The same keys in the same order as `record` writes them.
        adopted = {key: value for key, value in data.items() if key != "mutants"}
        adopted["code"] = code_hashes(paths)
        adopted["mutants"] = data["mutants"]
        with open(os.path.join(HERE, "outcomes", f"{piece}.json"), "w") as out:
            out.write(json.dumps(adopted, indent=1) + "\n")
    sys.exit(1 if failed else 0)


def base_of(data):
    """The commit a piece's mutants were made from: the first tree it names (a rerun of its
    survivors is refused unless the code is the same as there)."""
    return re.match(r"[0-9a-f]+", data["tree"]).group(0)


def equivalents():
    """mutant name -> why it behaves the same (tab-separated; # comments)."""
    listed = {}
    path = os.path.join(HERE, "equivalent.tsv")
    with open(path) as table:
        for number, line in enumerate(table, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            name, sep, why = line.partition("\t")
            if not sep or not why.strip():
                sys.exit(f"{path}:{number}: expected <mutant>TAB<why it is equivalent>")
            listed[name] = why.strip()
    return listed


def recorded():
    """piece -> its committed outcomes, for the pieces that have been run."""
    pieces = {}
    directory = os.path.join(HERE, "outcomes")
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            data = json.load(open(os.path.join(directory, name)))
            pieces[data["piece"]] = data
    return pieces


def tally(data, listed):
    """kind -> [mutant names] of one piece, survivors listed as equivalent apart."""
    kinds = defaultdict(list)
    for mutant in data["mutants"]:
        kind = mutant["outcome"]
        if kind == "missed" and mutant["name"] in listed:
            kind = "equivalent"
        kinds[kind].append(mutant["name"])
    return kinds


def score(kinds):
    caught = len(kinds["caught"]) + len(kinds["timeout"])
    scored = caught + len(kinds["missed"])
    return caught / scored if scored else None


def problems():
    lines = scope()
    runs = recorded()
    listed = equivalents()
    found = []
    for piece in dict.fromkeys(p for p, _, _ in lines):
        data = runs.get(piece)
        if data is None:
            found.append(f"piece {piece}: not run (tests/mutation/run {piece})")
            continue
        paths = [path for p, path, _ in lines if p == piece]
        for path in paths:
            if not any(matches(path, m["file"]) for m in data["mutants"]):
                found.append(f"piece {piece}: no mutant of {path} was tested")
        # The outcomes are of the code as it was: a change to it since makes them stale.
        base = base_of(data)
        if "code" in data:
            now = code_hashes(paths)
            found.extend(f"piece {piece}: the code of {file} changed since {base}: rerun tests/mutation/run {piece}"
                         for file in sorted(set(now) | set(data["code"])) if now.get(file) != data["code"].get(file))
        elif not has_commit(base):
            found.append(f"piece {piece}: its tree {base} is not in this clone, so whether its code changed "
                         f"cannot be told (a shallow clone: git fetch --unshallow)")
        else:
            found.extend(f"piece {piece}: the code of {file} changed since {base}: rerun tests/mutation/run {piece}"
                         for file in changed_since(base, paths))
        kinds = tally(data, listed)
        value = score(kinds)
        if value is not None and value < TARGET:
            found.append(f"piece {piece}: {value:.0%} of the viable mutants caught, under {TARGET:.0%}")
        found.extend(f"piece {piece}: survives, not listed as equivalent: {name}" for name in kinds["missed"])
    surviving = {m["name"] for data in runs.values() for m in data["mutants"] if m["outcome"] == "missed"}
    found.extend(f"listed as equivalent but not a surviving mutant now: {name}"
                 for name in listed if name not in surviving)
    return found


def row(piece, data, listed):
    """One piece's row of the report; tests/tests/mutation_scope.rs builds the same text."""
    if data is None:
        return f"| {piece} | not run |" + " |" * 7
    kinds = tally(data, listed)
    caught = len(kinds["caught"]) + len(kinds["timeout"])
    scored = caught + len(kinds["missed"])
    # Whole percents, rounded down, in integers: the test that rebuilds this row gets the same.
    shown = f"{caught} of {scored} ({caught * 100 // scored} %)" if scored else "no viable mutant"
    counts = " | ".join(str(len(kinds[k])) for k in ("caught", "timeout", "missed", "equivalent", "unviable"))
    return f"| {piece} | {data['tree']} | {counts} | {shown} | {data['seconds'] // 60} min |"


def report():
    lines = scope()
    runs = recorded()
    listed = equivalents()
    out = ["# Mutation testing report\n",
           "Written by `tests/mutation/run` from the committed outcomes in `tests/mutation/outcomes/` "
           "(one file per piece, every mutant with its outcome); do not edit by hand. The scope is "
           "`tests/mutation/scope.tsv`. `python3 tests/mutation/report.py check` says what falls short.\n",
           "- Each mutant is tested by the tests of the crate that holds its file (unit tests and that "
           "crate's integration tests; a whole run tries the unit tests first, and all of them on what "
           "those miss); the end-to-end suite in `tests/` is not counted.",
           "- Score = (caught + timeouts) / (caught + timeouts + missed). Mutants listed in "
           "`equivalent.tsv` (they behave exactly like the original) and unviable ones (they do not "
           "compile) are not scored.",
           "- Each piece names the tree it was run on: a piece run on an older tree says so.\n",
           "| piece | tree | caught | timeouts | missed | equivalent | unviable | score | took |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for piece in dict.fromkeys(p for p, _, _ in lines):
        out.append(row(piece, runs.get(piece), listed))
    machines = sorted({data["machine"] for data in runs.values()})
    out.append(f"\nMachine: {'; '.join(machines) if machines else 'no piece run yet'}.\n")
    out.append("## Scope\n")
    out.extend(f"- {piece}: `{path}`: {why}" for piece, path, why in lines)
    out.append("\n## Surviving mutants that behave like the original\n")
    equivalent = [(name, listed[name]) for name in sorted(listed)]
    out.extend(f"- `{name}`: {why}" for name, why in equivalent) if equivalent else out.append("None.")
    out.append("\n## Falling short\n")
    found = problems()
    out.extend(f"- {problem}" for problem in found) if found else out.append(
        "Nothing: every piece run on the code as it is, every scoped path mutated, every piece at or "
        "above 90 %.")
    print("\n".join(out))


def main():
    command, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if command == "scope" and not args:
        check_scope()
    elif command == "record" and len(args) == 4:
        record(*args)
    elif command == "survivors" and len(args) == 1:
        survivors(*args)
    elif command == "merge" and len(args) == 4:
        merge(*args)
    elif command == "unchanged" and len(args) >= 2:
        unchanged(args[0], args[1:])
    elif command == "adopt" and args:
        adopt(args)
    elif command == "report" and not args:
        report()
    elif command == "check" and not args:
        found = problems()
        for problem in found:
            print(f"tests/mutation: {problem}", file=sys.stderr)
        print(f"tests/mutation: {'FAILED' if found else 'every piece at or above 90 %'}", file=sys.stderr)
        sys.exit(1 if found else 0)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
