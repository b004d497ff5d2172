//! The cluster state `check` decides against: Namespaces and CSIDrivers read from a file.

use std::path::Path;

use inline_guard_admission::StaticClusterFacts;
use inline_guard_config::format::read_text;
use inline_guard_config::read_documents;

use super::CheckError;

/// Reads every Namespace and CSIDriver in `path`; any other object is an error naming its document.
pub fn load(path: &Path) -> Result<StaticClusterFacts, CheckError> {
    let text = read_text(path)?;
    let mut facts = StaticClusterFacts::new();
    for document in read_documents(path, &text)? {
        facts.insert_object(&document.value).map_err(|error| CheckError::Document {
            path: path.to_path_buf(),
            position: document.position,
            message: error.to_string(),
        })?;
    }
    Ok(facts)
}
