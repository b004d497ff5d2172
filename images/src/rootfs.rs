//! What an image holds for one platform: the program, its other names (links beside it), the
//! shared libraries the dynamic loader needs to start it (as the platform's loader lists them,
//! each stored at the path the loader looks for), and `/etc/passwd` and
//! `/etc/group` naming the one user it runs as. Nothing else: no shell, no package manager, no
//! CA certificates (both programs trust only the cluster's CA, from their ServiceAccount).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::layer::Layer;
use crate::platform::Platform;

/// Where the program goes in the image.
pub fn program_path(name: &str) -> String {
    format!("/usr/local/bin/{name}")
}

/// A file copied into the image as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopiedFile {
    /// Where it is read from.
    pub host: PathBuf,
    /// Where it goes in the image (absolute).
    pub image: String,
}

impl CopiedFile {
    /// `HOST_PATH:IMAGE_PATH`; the image's path absolute, without `..` or empty parts.
    pub fn parse(flag: &str) -> Result<Self> {
        let refused = |why: &str| Error::Input(format!("--file {}: {why}", crate::error::bounded(flag.as_bytes())));
        let (host, image) = flag.rsplit_once(':').ok_or_else(|| refused("not HOST_PATH:IMAGE_PATH"))?;
        let parts = image.strip_prefix('/').ok_or_else(|| refused("the image's path must be absolute"))?;
        if host.is_empty() || parts.split('/').any(|part| part.is_empty() || part == "." || part == "..") {
            return Err(refused("a path is empty, or the image's path has an empty, `.` or `..` part"));
        }
        Ok(CopiedFile { host: PathBuf::from(host), image: image.to_string() })
    }
}

/// Another name of a program in the image: a symbolic link beside it, for a program that acts
/// on the name it was started by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramLink {
    /// The other name (a file name).
    pub name: String,
    /// The program it names (one of the image's `--binary`).
    pub program: String,
}

impl ProgramLink {
    /// `NAME=PROGRAM`, both file names, `PROGRAM` one of `binaries`.
    pub fn parse(flag: &str, binaries: &[String]) -> Result<Self> {
        let refused = |why: &str| Error::Input(format!("--link {}: {why}", crate::error::bounded(flag.as_bytes())));
        let (name, program) = flag.split_once('=').ok_or_else(|| refused("not NAME=PROGRAM"))?;
        if !is_file_name(name) || !is_file_name(program) {
            return Err(refused("NAME and PROGRAM must be file names"));
        }
        if !binaries.iter().any(|binary| binary == program) || binaries.iter().any(|binary| binary == name) {
            return Err(refused("PROGRAM must be one of the image's --binary, and NAME none of them"));
        }
        Ok(ProgramLink { name: name.to_string(), program: program.to_string() })
    }
}

fn is_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/')
}

/// The image's files on `platform` for the programs `binaries` (by name), their `links` and
/// `files`, run as `uid` (0 for root).
pub fn rootfs(
    platform: &Platform,
    binaries: &[String],
    links: &[ProgramLink],
    files: &[CopiedFile],
    uid: u32,
) -> Result<Layer> {
    let mut layer = Layer::default();
    for name in binaries {
        if !is_file_name(name) {
            return Err(Error::Input(format!(
                "--binary {}: a program's file name",
                crate::error::bounded(name.as_bytes())
            )));
        }
        let binary = platform.binary(name)?;
        layer.add_file(&program_path(name), 0o755, read(&binary)?);
        for library in platform.libraries(&binary)? {
            layer.add_file(&library.image, 0o755, read(&library.host)?);
        }
    }
    // Beside the program, named relatively: the link resolves inside the image's root wherever
    // that root is (a container's, a chroot's, qemu's prefix).
    for link in links {
        layer.add_symlink(&program_path(&link.name), &link.program);
    }
    for file in files {
        use std::os::unix::fs::PermissionsExt as _;
        let metadata =
            std::fs::metadata(&file.host).map_err(|e| Error::Input(format!("{}: {e}", file.host.display())))?;
        if !metadata.is_file() {
            return Err(Error::Input(format!("{}: not a regular file", file.host.display())));
        }
        let mode = if metadata.permissions().mode() & 0o111 != 0 { 0o755 } else { 0o644 };
        layer.add_file(&file.image, mode, read(&file.host)?);
    }
    let (passwd, group) = accounts(uid);
    layer.add_file("/etc/passwd", 0o644, passwd.into_bytes());
    layer.add_file("/etc/group", 0o644, group.into_bytes());
    layer.add_dir("/tmp");
    Ok(layer)
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::Input(format!("{}: {e}", path.display())))
}

/// `/etc/passwd` and `/etc/group`: root, and the non-root user `uid` runs as when it is not 0.
fn accounts(uid: u32) -> (String, String) {
    let mut passwd = "root:x:0:0:root:/:/sbin/nologin\n".to_string();
    let mut group = "root:x:0:\n".to_string();
    if uid != 0 {
        passwd.push_str(&format!("nonroot:x:{uid}:{uid}:nonroot:/:/sbin/nologin\n"));
        group.push_str(&format!("nonroot:x:{uid}:\n"));
    }
    (passwd, group)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::Architecture;

    fn host() -> Platform {
        Platform { architecture: Architecture::Amd64, binaries: None, sysroot: None }
    }

    #[test]
    fn a_copied_file_names_a_host_path_and_an_absolute_image_path() {
        let file = CopiedFile::parse("/tmp/x/helper.sh:/providers/helper.sh").unwrap();
        assert_eq!(file, CopiedFile { host: PathBuf::from("/tmp/x/helper.sh"), image: "/providers/helper.sh".into() });
        for refused in
            ["helper.sh", "/tmp/helper.sh:providers/helper.sh", "/h:/providers/../etc/passwd", "/h:/a//b", ":/a"]
        {
            let error = CopiedFile::parse(refused).unwrap_err().to_string();
            assert!(error.starts_with(&format!("--file {refused}: ")), "{refused}: {error}");
        }
    }

    #[test]
    fn a_copied_file_keeps_its_content_and_is_executable_when_it_is_on_the_host() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let (script, data) = (dir.path().join("helper.sh"), dir.path().join("data"));
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(&data, "x").unwrap();
        let files = [
            CopiedFile { host: script.clone(), image: "/providers/helper.sh".into() },
            CopiedFile { host: data, image: "/providers/data".into() },
        ];
        let tar = rootfs(&host(), &[], &[], &files, 0).unwrap().to_tar(0).unwrap();
        let mut found = Vec::new();
        for entry in tar::Archive::new(tar.as_slice()).entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            if path.starts_with("providers/") && entry.header().entry_type().is_file() {
                let mode = entry.header().mode().unwrap();
                let mut content = String::new();
                std::io::Read::read_to_string(&mut entry, &mut content).unwrap();
                found.push((path, mode, content));
            }
        }
        assert_eq!(
            found,
            [
                ("providers/data".to_string(), 0o644, "x".to_string()),
                ("providers/helper.sh".to_string(), 0o755, "#!/bin/sh\n".to_string())
            ]
        );
        let missing = [CopiedFile { host: dir.path().join("missing"), image: "/m".into() }];
        assert!(rootfs(&host(), &[], &[], &missing, 0).unwrap_err().to_string().contains("missing"));
    }

    #[test]
    fn a_link_names_one_of_the_images_programs_by_another_file_name() {
        let binaries = ["driver".to_string()];
        assert_eq!(
            ProgramLink::parse("controller=driver", &binaries).unwrap(),
            ProgramLink { name: "controller".into(), program: "driver".into() }
        );
        for refused in ["controller", "controller=other", "driver=driver", "../x=driver", "a/b=driver", "=driver"] {
            let error = ProgramLink::parse(refused, &binaries).unwrap_err().to_string();
            assert!(error.starts_with(&format!("--link {refused}: ")), "{refused}: {error}");
        }
    }

    #[test]
    fn a_non_root_user_is_named_in_passwd_and_group() {
        let (passwd, group) = accounts(65532);
        assert!(passwd.lines().any(|l| l == "nonroot:x:65532:65532:nonroot:/:/sbin/nologin"));
        assert!(group.lines().any(|l| l == "nonroot:x:65532:"));
        assert_eq!(accounts(0).0.lines().count(), 1, "root only");
    }
}
