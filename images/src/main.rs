//! `oci-image`: one program's container image as an OCI layout in a tar, built offline from the
//! program itself (see `images/build`, which calls it for both of the project's images).

mod error;
mod layer;
mod layout;
mod rootfs;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use error::{Error, Result};
use layout::ImageSpec;

/// Builds one image.
#[derive(Debug, Parser)]
#[command(version, about = "Builds a program's container image as an OCI layout in a tar, offline and reproducibly")]
struct Flags {
    /// A program (a release binary), with the libraries it loads; the first is the entrypoint
    /// unless `--entrypoint` says otherwise, the others are there to be named by a container's
    /// `command`.
    #[arg(long = "binary", required_unless_present = "files")]
    binaries: Vec<PathBuf>,
    /// A file copied as it is, `HOST_PATH:IMAGE_PATH` (executable in the image when it is on the
    /// host); nothing it loads comes with it (the example providers' static busybox, scripts).
    #[arg(long = "file")]
    files: Vec<String>,
    /// The entrypoint, one argument per flag, instead of the first binary.
    #[arg(long = "entrypoint")]
    entrypoint: Vec<String>,
    /// The repository, without a tag.
    #[arg(long)]
    repository: String,
    /// The tag and version label.
    #[arg(long)]
    version: String,
    /// The commit built.
    #[arg(long)]
    revision: String,
    /// Where the source lives.
    #[arg(long)]
    source: String,
    /// The commit's time, seconds since the epoch.
    #[arg(long)]
    created: i64,
    /// The user id it runs as (0: root).
    #[arg(long, default_value_t = 65532)]
    uid: u32,
    /// The archive to write.
    #[arg(long)]
    out: PathBuf,
}

fn main() -> ExitCode {
    match run(Flags::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("oci-image: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(flags: Flags) -> Result<()> {
    let files = flags.files.iter().map(|file| rootfs::CopiedFile::parse(file)).collect::<Result<Vec<_>>>()?;
    let rootfs = rootfs::rootfs(&flags.binaries, &files, flags.uid)?;
    let entrypoint = match (flags.entrypoint.is_empty(), flags.binaries.first()) {
        (false, _) => flags.entrypoint.clone(),
        (true, Some(first)) => {
            vec![rootfs::program_path(first.file_name().and_then(|n| n.to_str()).unwrap_or_default())]
        }
        (true, None) => return Err(Error::Input("an image without a --binary needs its --entrypoint".into())),
    };
    let spec = ImageSpec {
        repository: flags.repository.clone(),
        version: flags.version.clone(),
        revision: flags.revision,
        source: flags.source,
        created: flags.created,
        entrypoint,
        user: format!("{0}:{0}", flags.uid),
    };
    let write = |source| Error::Write { path: flags.out.display().to_string(), source };
    let image = layout::build(&spec, &rootfs).map_err(write)?;
    // Written beside, then renamed: a cut-off build leaves no half archive under the name.
    let partial = flags.out.with_extension("tar.partial");
    std::fs::write(&partial, &image.archive).map_err(write)?;
    std::fs::rename(&partial, &flags.out).map_err(write)?;
    println!(
        "{}: {}:{} {} ({:.1} MB uncompressed)",
        flags.out.display(),
        flags.repository,
        flags.version,
        image.digest,
        image.layer_bytes as f64 / 1e6
    );
    Ok(())
}
