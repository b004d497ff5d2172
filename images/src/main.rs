//! `oci-image`: one program's container image, for each platform it was built for, as an OCI
//! layout in a tar, built offline from the programs themselves (see `images/build`, which calls
//! it for each of the project's images).

mod error;
mod layer;
mod layout;
mod platform;
mod rootfs;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use error::{Error, Result};
use layout::ImageSpec;
use platform::Platform;

/// Builds one image.
#[derive(Debug, Parser)]
#[command(version, about = "Builds a program's container image as an OCI layout in a tar, offline and reproducibly")]
struct Flags {
    /// A platform, `ARCH[:BINARY_DIR[:SYSROOT]]` (amd64, arm64), one per flag, in the image
    /// index's order: where its release binaries are, and the sysroot its libraries come from
    /// when it is not this machine's architecture (listed by its loader under qemu).
    #[arg(long = "platform", required = true)]
    platforms: Vec<String>,
    /// A program (a release binary's file name, in each platform's binary directory), with the
    /// libraries it loads; the first is the entrypoint unless `--entrypoint` says otherwise, the
    /// others are there to be named by a container's `command`.
    #[arg(long = "binary", required_unless_present = "files")]
    binaries: Vec<String>,
    /// Another name of a program, `NAME=PROGRAM` (PROGRAM one of `--binary`): a symbolic link
    /// beside it, for a program that acts on the name it was started by.
    #[arg(long = "link")]
    links: Vec<String>,
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
    let links =
        flags.links.iter().map(|link| rootfs::ProgramLink::parse(link, &flags.binaries)).collect::<Result<Vec<_>>>()?;
    let platforms = flags.platforms.iter().map(|flag| Platform::parse(flag)).collect::<Result<Vec<_>>>()?;
    let mut rootfs = Vec::new();
    for platform in &platforms {
        if rootfs.iter().any(|(architecture, _)| *architecture == platform.architecture) {
            return Err(Error::Input(format!("--platform {} is given twice", platform.architecture.name())));
        }
        rootfs.push((platform.architecture, rootfs::rootfs(platform, &flags.binaries, &links, &files, flags.uid)?));
    }
    let entrypoint = match (flags.entrypoint.is_empty(), flags.binaries.first()) {
        (false, _) => flags.entrypoint.clone(),
        (true, Some(first)) => vec![rootfs::program_path(first)],
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
    let sizes: Vec<String> = image
        .platforms
        .iter()
        .map(|(architecture, manifest, bytes)| {
            format!("linux/{} {manifest} {:.1} MB uncompressed", architecture.name(), *bytes as f64 / 1e6)
        })
        .collect();
    println!("{}: {}:{} {} ({})", flags.out.display(), flags.repository, flags.version, image.digest, sizes.join("; "));
    Ok(())
}
