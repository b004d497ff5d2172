"""Turns cargo-mutants' outcomes.json into tests/mutation/REPORT.md (on stdout), or with --check
says on stderr what falls short and exits 1: a file under 90 %, or a surviving mutant that is
not listed as equivalent in equivalent.tsv (or one listed there that no longer survives)."""

import json
import os
import platform
import sys
from collections import defaultdict

TARGET = 0.90


def cpu_model():
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def equivalents(path):
    """mutant name -> why it behaves the same (tab-separated; # comments)."""
    listed = {}
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


def main():
    args = sys.argv[1:]
    check = args[:1] == ["--check"]
    if check:
        args = args[1:]
    outcomes_path, equivalent_path, elapsed, tree = args
    outcomes = json.load(open(outcomes_path))
    listed = equivalents(equivalent_path)

    per_file = defaultdict(lambda: defaultdict(list))
    for outcome in outcomes["outcomes"]:
        mutant = outcome["scenario"]
        if mutant == "Baseline":
            continue
        mutant = mutant["Mutant"]
        summary = outcome["summary"]
        kind = {"CaughtMutant": "caught", "MissedMutant": "missed", "Unviable": "unviable",
                "Timeout": "timeout"}.get(summary, summary)
        if kind == "missed" and mutant["name"] in listed:
            kind = "equivalent"
        per_file[mutant["file"]][kind].append(mutant["name"])

    problems = []
    rows = []
    for file in sorted(per_file):
        kinds = per_file[file]
        caught, timeout = len(kinds["caught"]), len(kinds["timeout"])
        missed, equivalent = len(kinds["missed"]), len(kinds["equivalent"])
        scored = caught + timeout + missed
        score = (caught + timeout) / scored if scored else 1.0
        rows.append((file, caught, timeout, missed, equivalent, len(kinds["unviable"]), score))
        if score < TARGET:
            problems.append(f"{file}: {score:.0%} of the scored mutants caught, under {TARGET:.0%}")
        problems.extend(f"survives, not listed as equivalent: {name}" for name in kinds["missed"])
    seen_equivalent = {name for kinds in per_file.values() for name in kinds["equivalent"]}
    problems.extend(f"listed as equivalent but not a surviving mutant now: {name}"
                    for name in listed if name not in seen_equivalent)

    if check:
        for problem in problems:
            print(f"tests/mutation: {problem}", file=sys.stderr)
        print(f"tests/mutation: {len(rows)} files, {'FAILED' if problems else 'every file at or above 90 %'}",
              file=sys.stderr)
        sys.exit(1 if problems else 0)

    minutes = int(elapsed) / 60
    out = []
    out.append("# Mutation testing report\n")
    out.append("Written by `tests/mutation/run` (cargo-mutants "
               f"{outcomes.get('cargo_mutants_version', '?')}); do not edit by hand.\n")
    out.append(f"- Tree: {tree}.")
    out.append(f"- Machine: {os.cpu_count()} CPUs ({cpu_model()}); the run took {minutes:.0f} min.")
    out.append("- Each mutant is tested by the tests of the crate that holds its file (unit tests and that "
               "crate's integration tests); the suite's golden corpus in `tests/` is not counted.")
    out.append("- Score = (caught + timeouts) / (caught + timeouts + missed). Mutants listed in "
               "`equivalent.tsv` (they behave exactly like the original) and unviable ones (they do "
               "not compile) are not scored.\n")
    out.append("| file | caught | timeouts | missed | equivalent | unviable | score |")
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    for file, caught, timeout, missed, equivalent, unviable, score in rows:
        out.append(f"| `{file}` | {caught} | {timeout} | {missed} | {equivalent} | {unviable} | {score:.0%} |")
    totals = [sum(row[i] for row in rows) for i in range(1, 6)]
    scored = totals[0] + totals[1] + totals[2]
    total_score = (totals[0] + totals[1]) / scored if scored else 1.0
    out.append(f"| **all** | {totals[0]} | {totals[1]} | {totals[2]} | {totals[3]} | {totals[4]} | "
               f"{total_score:.0%} |\n")
    out.append("## Surviving mutants that behave like the original\n")
    equivalent_rows = [(name, listed[name]) for name in sorted(seen_equivalent)]
    if equivalent_rows:
        out.extend(f"- `{name}`: {why}" for name, why in equivalent_rows)
    else:
        out.append("None.")
    out.append("\n## Surviving mutants not accounted for\n")
    missed = [name for kinds in per_file.values() for name in kinds["missed"]]
    out.extend(f"- `{name}`" for name in missed) if missed else out.append("None.")
    out.append("\n## Falling short\n")
    out.extend(f"- {problem}" for problem in problems) if problems else out.append(
        "Nothing: every file is at or above 90 %.")
    print("\n".join(out))


main()
