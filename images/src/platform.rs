//! One platform of an image: its architecture, where its programs were built, and how to list
//! the libraries they load. A program of the machine's own architecture is listed by `ldd`; a
//! program of another by its own dynamic loader (`ld.so --list`, which is what `ldd` runs) from
//! a sysroot of that architecture (Debian's `libc6-dev-arm64-cross`: `/usr/aarch64-linux-gnu`),
//! run by a user-mode emulator (`qemu-user-static`), the libraries then copied from that sysroot.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result, bounded};

/// The architectures an image can be built for, by their OCI names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Architecture {
    /// `amd64` (x86_64).
    Amd64,
    /// `arm64` (aarch64).
    Arm64,
}

impl Architecture {
    /// The OCI name.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Amd64 => "amd64",
            Architecture::Arm64 => "arm64",
        }
    }

    /// glibc's dynamic loader for this architecture, where programs name it.
    fn loader(self) -> &'static str {
        match self {
            Architecture::Amd64 => "/lib64/ld-linux-x86-64.so.2",
            Architecture::Arm64 => "/lib/ld-linux-aarch64.so.1",
        }
    }

    /// qemu's user-mode emulator for this architecture.
    fn emulator(self) -> &'static str {
        match self {
            Architecture::Amd64 => "qemu-x86_64-static",
            Architecture::Arm64 => "qemu-aarch64-static",
        }
    }

    fn parse(name: &str) -> Result<Self> {
        match name {
            "amd64" => Ok(Architecture::Amd64),
            "arm64" => Ok(Architecture::Arm64),
            other => Err(Error::Input(format!("{}: not an architecture (amd64, arm64)", bounded(other.as_bytes())))),
        }
    }
}

/// Where one architecture's programs are, and its libraries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// Its architecture.
    pub architecture: Architecture,
    /// The directory of its release binaries (none for an image of copied files only).
    pub binaries: Option<PathBuf>,
    /// The sysroot its libraries come from; none: the machine's own (`ldd`).
    pub sysroot: Option<PathBuf>,
}

/// A library of a program: where the image holds it, and where it is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    /// Its path in the image (where the loader looks).
    pub image: String,
    /// Its path on this machine.
    pub host: PathBuf,
}

impl Platform {
    /// `ARCH[:BINARY_DIR[:SYSROOT]]`, e.g. `arm64:target/aarch64-unknown-linux-gnu/release:/usr/aarch64-linux-gnu`.
    pub fn parse(flag: &str) -> Result<Self> {
        let mut parts = flag.splitn(3, ':');
        let architecture = Architecture::parse(parts.next().unwrap_or_default())?;
        let path = |part: Option<&str>| part.filter(|p| !p.is_empty()).map(PathBuf::from);
        let (binaries, sysroot) = (path(parts.next()), path(parts.next()));
        if sysroot.as_deref().is_some_and(|s| !s.is_absolute()) {
            return Err(Error::Input(format!("--platform {}: the sysroot must be absolute", bounded(flag.as_bytes()))));
        }
        Ok(Platform { architecture, binaries, sysroot })
    }

    /// The program `name` built for this platform.
    pub fn binary(&self, name: &str) -> Result<PathBuf> {
        let dir = self.binaries.as_ref().ok_or_else(|| {
            Error::Input(format!("--platform {}: no binary directory for --binary {name}", self.architecture.name()))
        })?;
        Ok(dir.join(name))
    }

    /// The libraries `binary` loads, the dynamic loader included; none for a static program.
    pub fn libraries(&self, binary: &Path) -> Result<Vec<Library>> {
        let (mut command, what) = match &self.sysroot {
            None => {
                let mut ldd = Command::new("ldd");
                ldd.arg(binary);
                (ldd, "ldd (libc-bin)".to_string())
            }
            Some(sysroot) => {
                let emulator = self.architecture.emulator();
                let mut listing = Command::new(emulator);
                listing
                    .arg("-L")
                    .arg(sysroot)
                    .arg(sysroot.join(self.architecture.loader().trim_start_matches('/')))
                    .arg("--list")
                    .arg(binary);
                (listing, format!("{emulator} (qemu-user-static) running the {} loader", self.architecture.name()))
            }
        };
        let output =
            command.output().map_err(|e| Error::Input(format!("running {what} on {}: {e}", binary.display())))?;
        let text = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            // The loaders' answer for a program that loads nothing.
            if String::from_utf8_lossy(&output.stderr).contains("not a dynamic executable")
                || text.contains("not a dynamic executable")
                || text.contains("statically linked")
            {
                return Ok(Vec::new());
            }
            return Err(Error::Input(format!("{what} on {}: {}", binary.display(), bounded(&output.stderr))));
        }
        parse_listing(&text, self.sysroot.as_deref())
    }
}

/// The libraries in a loader's listing (`ldd`'s format). With a sysroot, the listing names
/// paths as the program sees them (the emulator maps them into the sysroot), except the loader
/// itself, named by its path in the sysroot after `=>`.
fn parse_listing(listing: &str, sysroot: Option<&Path>) -> Result<Vec<Library>> {
    let mut libraries = Vec::new();
    for line in listing.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.contains("not found") {
            return Err(Error::Input(format!("a library the program needs is missing: {}", bounded(line.as_bytes()))));
        }
        let (named, found) = match line.split_once("=>") {
            Some((named, found)) => (named.trim(), found.trim().split(" (").next().unwrap_or_default().trim()),
            None => ("", line.split(" (").next().unwrap_or_default().trim()),
        };
        // The vDSO is the kernel's, not a file.
        if !found.starts_with('/') {
            continue;
        }
        let library = match sysroot {
            None => Library { image: found.to_string(), host: PathBuf::from(found) },
            Some(sysroot) => {
                let inside = Path::new(found).strip_prefix(sysroot).ok().map(|p| format!("/{}", p.display()));
                // The loader: where the program names it (`/lib/ld-linux-aarch64.so.1 => SYSROOT/lib/...`).
                let image =
                    if named.starts_with('/') { named.to_string() } else { inside.clone().unwrap_or(found.into()) };
                let host = match inside {
                    Some(_) => PathBuf::from(found),
                    None => sysroot.join(found.trim_start_matches('/')),
                };
                Library { image, host }
            }
        };
        libraries.push(library);
    }
    Ok(libraries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images(libraries: &[Library]) -> Vec<(&str, String)> {
        libraries.iter().map(|l| (l.image.as_str(), l.host.display().to_string())).collect()
    }

    #[test]
    fn ldd_s_listing_names_each_library_and_the_loader_but_not_the_vdso() {
        let listing = "\tlinux-vdso.so.1 (0x00007ffd5a1f0000)\n\tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f1)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f3)\n";
        let found = parse_listing(listing, None).unwrap();
        let same = |p: &'static str| (p, p.to_string());
        assert_eq!(
            images(&found),
            [
                same("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                same("/lib/x86_64-linux-gnu/libc.so.6"),
                same("/lib64/ld-linux-x86-64.so.2")
            ]
        );
    }

    #[test]
    fn an_emulated_listing_puts_libraries_where_the_program_sees_them_and_reads_them_from_the_sysroot() {
        // What `qemu-aarch64-static -L /usr/aarch64-linux-gnu .../ld-linux-aarch64.so.1 --list` says.
        let listing = "\t (0x0000005502850000)\n\tlibgcc_s.so.1 => /lib/libgcc_s.so.1 (0x01)\n\tlibc.so.6 => /lib/libc.so.6 (0x02)\n\t/lib/ld-linux-aarch64.so.1 => /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 (0x03)\n";
        let found = parse_listing(listing, Some(Path::new("/usr/aarch64-linux-gnu"))).unwrap();
        assert_eq!(
            images(&found),
            [
                ("/lib/libgcc_s.so.1", "/usr/aarch64-linux-gnu/lib/libgcc_s.so.1".to_string()),
                ("/lib/libc.so.6", "/usr/aarch64-linux-gnu/lib/libc.so.6".to_string()),
                ("/lib/ld-linux-aarch64.so.1", "/usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1".to_string()),
            ]
        );
    }

    #[test]
    fn a_missing_library_is_an_error_naming_it() {
        let error = parse_listing("\tlibfoo.so.1 => not found\n", None).unwrap_err();
        assert_eq!(error.to_string(), "a library the program needs is missing: libfoo.so.1 => not found");
    }

    #[test]
    fn a_platform_flag_names_an_architecture_its_binaries_and_an_absolute_sysroot() {
        let parsed = Platform::parse("arm64:target/x/release:/usr/aarch64-linux-gnu").unwrap();
        assert_eq!(parsed.architecture, Architecture::Arm64);
        assert_eq!(parsed.binaries, Some(PathBuf::from("target/x/release")));
        assert_eq!(parsed.sysroot, Some(PathBuf::from("/usr/aarch64-linux-gnu")));
        assert_eq!(Platform::parse("amd64").unwrap().binaries, None);
        assert!(Platform::parse("riscv64:dir").unwrap_err().to_string().starts_with("riscv64: not an architecture"));
        assert!(Platform::parse("arm64:dir:relative").unwrap_err().to_string().contains("must be absolute"));
    }
}
