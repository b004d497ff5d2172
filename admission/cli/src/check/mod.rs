//! `check`: the admission chain run offline. Every input is read and validated before anything is
//! evaluated, so bad input never produces half an answer.

mod request;
pub(crate) mod table;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_executor::block_on;
use inline_guard_admission::plugins::standard_chain;
use inline_guard_admission::review::ReviewResponse;
use inline_guard_admission::{AdmissionError, Chain, ClusterStateError, Outcome, Phase, StaticClusterFacts};
use inline_guard_config::documents::Position;
use inline_guard_config::{AdmissionConfig, read_documents};

use crate::cli::Output;
pub use request::{Prepared, anonymous_create};

/// The arguments of `check`.
#[derive(Debug, Clone)]
pub struct CheckArgs {
    /// Namespaces and CSIDrivers.
    pub cluster_state: PathBuf,
    /// The configuration file, if not the built-in default.
    pub config: Option<PathBuf>,
    /// Table or JSON lines.
    pub output: Output,
    /// Manifest files; `-` is stdin.
    pub inputs: Vec<PathBuf>,
}

/// What `check` found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Objects evaluated.
    pub evaluated: usize,
    /// Objects denied.
    pub denied: usize,
}

/// Input `check` cannot work with. Each names the file and, where there is one, the document.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A file could not be read or parsed, or the configuration is invalid.
    #[error(transparent)]
    File(#[from] inline_guard_config::Error),
    /// The cluster state holds something other than Namespaces and CSIDrivers.
    #[error(transparent)]
    ClusterState(#[from] ClusterStateError),
    /// One document of a file is unusable.
    #[error("{}: {position}: {message}", path.display())]
    Document {
        /// The file.
        path: PathBuf,
        /// Which document.
        position: Position,
        /// What is wrong.
        message: String,
    },
    /// Entries of an input directory that look like manifests but cannot be read as files.
    #[error("{}: cannot read {}", dir.display(), entries.join("; "))]
    Unreadable {
        /// The directory.
        dir: PathBuf,
        /// Each entry and why.
        entries: Vec<String>,
    },
    /// Standard input was named twice, or could not be read.
    #[error("standard input: {0}")]
    Stdin(String),
    /// The output could not be written.
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

/// One evaluated object.
#[derive(Debug, Clone)]
pub struct Evaluation {
    /// Where it came from.
    pub source: String,
    /// `Kind namespace/name`.
    pub label: String,
    /// The request uid (synthesised for plain objects).
    pub uid: String,
    /// The chain's answer.
    pub outcome: Outcome,
}

/// Name used for standard input in messages.
const STDIN_NAME: &str = "<stdin>";

/// Runs `check` and writes its report to `stdout`.
pub fn run(args: &CheckArgs, stdin: &mut dyn Read, stdout: &mut dyn Write) -> Result<Summary, CheckError> {
    let config = AdmissionConfig::load_or_default(args.config.as_deref())?;
    let facts = StaticClusterFacts::load(&args.cluster_state)?;

    let mut prepared = Vec::new();
    let mut stdin_used = false;
    for input in &expand_directories(&args.inputs)? {
        let (name, text) = if input.as_os_str() == "-" {
            if stdin_used {
                return Err(CheckError::Stdin("`-` given more than once".into()));
            }
            stdin_used = true;
            let mut text = String::new();
            let limit = inline_guard_config::format::MAX_INPUT_BYTES;
            stdin.take(limit + 1).read_to_string(&mut text).map_err(|error| CheckError::Stdin(error.to_string()))?;
            if text.len() as u64 > limit {
                return Err(CheckError::Stdin(format!("larger than {limit} bytes; refusing to read it")));
            }
            (PathBuf::from(STDIN_NAME), text)
        } else {
            (input.clone(), inline_guard_config::format::read_text(input)?)
        };
        for document in read_documents(&name, &text)? {
            let position = document.position;
            let request = request::prepare(document.value, document.raw_json.as_deref(), prepared.len() + 1)
                .map_err(|message| CheckError::Document { path: name.clone(), position, message })?;
            prepared.push((source(&name, position), request));
        }
    }

    let facts = Arc::new(facts);
    let chain = standard_chain(Arc::new(config.settings), facts.clone(), facts);
    // A file's facts never wait on I/O, so a plain executor suffices.
    let evaluations = block_on(evaluate_all(&chain, Phase::Both, prepared));

    match args.output {
        Output::Json => {
            for evaluation in &evaluations {
                let response = ReviewResponse::from_outcome(&evaluation.uid, evaluation.outcome.clone());
                writeln!(stdout, "{}", response.to_json())?;
            }
        }
        Output::Table => {
            table::write(stdout, &evaluations)?;
            let denied = evaluations.iter().filter(|e| !e.outcome.is_allowed()).count();
            writeln!(
                stdout,
                "\n{} objects: {} admitted, {denied} denied",
                evaluations.len(),
                evaluations.len() - denied
            )?;
        }
    }
    Ok(Summary { evaluated: evaluations.len(), denied: evaluations.iter().filter(|e| !e.outcome.is_allowed()).count() })
}

/// Runs `phase` of `chain` on every prepared request, in order. `sources` say where each came from.
pub async fn evaluate_all(chain: &Chain, phase: Phase, prepared: Vec<(String, Prepared)>) -> Vec<Evaluation> {
    let mut evaluations = Vec::with_capacity(prepared.len());
    for (source, request) in prepared {
        let (uid, label, outcome) = match request {
            Prepared::Ready { uid, label, mut attributes } => (uid, label, chain.run(phase, &mut attributes).await),
            Prepared::Undecodable { uid, label, error } => {
                (uid, label, Outcome::rejected(AdmissionError::BadRequest(error.to_string())))
            }
        };
        evaluations.push(Evaluation { source, label, uid, outcome });
    }
    evaluations
}

/// Replaces each directory by its `.yaml`, `.yml` and `.json` files in name order (not
/// recursively), as `kubectl apply -f DIR` does.
fn expand_directories(inputs: &[PathBuf]) -> Result<Vec<PathBuf>, CheckError> {
    let mut files = Vec::new();
    for input in inputs {
        if !input.is_dir() {
            files.push(input.clone());
            continue;
        }
        let read_error = |source| inline_guard_config::Error::Read { path: input.clone(), source };
        let mut entries = Vec::new();
        let mut unreadable = Vec::new();
        for entry in std::fs::read_dir(input).map_err(read_error)? {
            let path = entry.map_err(read_error)?.path();
            let is_manifest = path.extension().is_some_and(|ext| ext == "yaml" || ext == "yml" || ext == "json");
            if !is_manifest {
                continue;
            }
            // Followed like kubectl follows it; a subdirectory is not read (no recursion), but
            // anything else that is not a regular file is an error, never silently skipped.
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            match std::fs::metadata(&path) {
                Ok(metadata) if metadata.is_file() => entries.push(path),
                Ok(metadata) if metadata.is_dir() => {}
                Ok(_) => unreadable.push(format!("{name:?} (not a regular file: a FIFO, socket or device)")),
                Err(error) if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) => {
                    unreadable.push(format!("{name:?} (a symlink that leads nowhere: {error})"))
                }
                Err(error) => unreadable.push(format!("{name:?} ({error})")),
            }
        }
        if !unreadable.is_empty() {
            unreadable.sort();
            return Err(CheckError::Unreadable { dir: input.clone(), entries: unreadable });
        }
        entries.sort();
        files.extend(entries);
    }
    Ok(files)
}

fn source(path: &Path, position: Position) -> String {
    format!("{}:{position}", path.display())
}
