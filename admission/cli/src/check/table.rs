//! The report a person reads: one line per object, then what was said about it.

use std::io::{self, Write};

use inline_guard_policy::patch::PatchOp;

use super::Evaluation;

/// Writes the table, with the details of each object indented under it.
pub fn write(out: &mut dyn Write, evaluations: &[Evaluation]) -> io::Result<()> {
    let width = evaluations.iter().map(|e| e.label.len()).max().unwrap_or(0).max("OBJECT".len());
    writeln!(out, "{:<width$}  {:<8}  SOURCE", "OBJECT", "DECISION")?;
    for evaluation in evaluations {
        let outcome = &evaluation.outcome;
        let decision = if outcome.is_allowed() { "admitted" } else { "denied" };
        writeln!(out, "{:<width$}  {decision:<8}  {}", evaluation.label, evaluation.source)?;
        if let Err(error) = &outcome.result {
            writeln!(out, "    deny     {error}")?;
        }
        for warning in &outcome.warnings {
            writeln!(out, "    warning  {warning}")?;
        }
        for (key, value) in &outcome.audit_annotations {
            writeln!(out, "    audit    {key}: {value}")?;
        }
        for operation in &outcome.patch {
            let op = match operation.op {
                PatchOp::Add => "add",
                PatchOp::Replace => "replace",
            };
            // The values are plain structs of strings and booleans: serializing them cannot fail.
            let value = serde_json::to_string(&operation.value).unwrap_or_default();
            writeln!(out, "    patch    {op} {} = {value}", operation.path)?;
        }
    }
    Ok(())
}
